#!/usr/bin/env python3
"""Regenerate crds/ and charts/reprieve/templates/crd.yaml from the pydantic models (--check: verify only)."""

import sys

from reprieve_operator.crdgen import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
