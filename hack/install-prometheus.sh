#!/usr/bin/env bash
# The Prometheus the dashboard test runs (tests/e2e/test_dashboard_e2e.py): Debian 12's `prometheus` package
# (2.42), installed with apt-get when missing and running as root on Debian. Its service is never started (the
# test runs the binary as a plain process on loopback with a config of its own). Prints the binary's path on
# stdout; exits 3 naming what is missing otherwise (the dashboard tier then reports NOT RUN with that reason).
set -euo pipefail

cache="${REPRIEVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/reprieve}"
mkdir -p "$cache"
say() { echo "install-prometheus: $*" >&2; }

# shellcheck source=hack/apt-package.sh
source "$(dirname "${BASH_SOURCE[0]}")/apt-package.sh"
ensure_apt_package prometheus apt-get-prometheus.log
command -v prometheus
