"""A benchmark script (``benchmarks/<name>.py``, not a package) imported as a module, for the tests that run its
functions or check its premises."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None, name
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a dataclass in the script looks its module up there
    spec.loader.exec_module(module)
    return module
