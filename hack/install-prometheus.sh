#!/usr/bin/env bash
# The Prometheus the dashboard test runs (tests/e2e/test_dashboard_e2e.py): Debian 12's `prometheus` package
# (2.42), installed with apt-get when missing and running as root on Debian. Its service is never started (the
# test runs the binary as a plain process on loopback with a config of its own). Prints the binary's path on
# stdout; exits 3 naming what is missing otherwise (the dashboard tier then reports NOT RUN with that reason).
set -euo pipefail

cache="${REPRIEVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/reprieve}"
mkdir -p "$cache"
say() { echo "install-prometheus: $*" >&2; }

if ! command -v prometheus >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing Debian package prometheus"
    start=$(date +%s)
    # policy-rc.d 101: the package's postinst must not start (or enable) a system-wide Prometheus.
    policy=/usr/sbin/policy-rc.d
    had_policy=0; [ -e "$policy" ] && had_policy=1
    [ "$had_policy" = 1 ] || { printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod +x "$policy"; }
    ok=1
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        prometheus; } >"$cache/apt-get-prometheus.log" 2>&1 || ok=0
    [ "$had_policy" = 1 ] || rm -f "$policy"
    if [ "$ok" = 0 ]; then
      tail -20 "$cache/apt-get-prometheus.log" >&2
      say "apt-get install prometheus failed (log above, full log $cache/apt-get-prometheus.log)"
      exit 3
    fi
    say "installed in $(( $(date +%s) - start ))s"
  fi
fi
if ! command -v prometheus >/dev/null 2>&1; then
  say "missing: prometheus. On Debian 12 as root: apt-get install prometheus"
  exit 3
fi
command -v prometheus
