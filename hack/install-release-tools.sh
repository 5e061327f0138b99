#!/usr/bin/env bash
# What the local release path needs (hack/release.py, hack/localcluster/registry.py), once, cached by version:
#   docker-registry  Debian 12's package (the CNCF distribution registry 2.8), apt-get when missing and running as
#                    root on Debian; its service is never started (the cluster runs the binary on loopback with a
#                    configuration of its own)
#   a venv           $cache/release-venv-<key>: pypiserver (the package index), passlib (its htpasswd) and twine
#                    (the upload client), pinned below; the key is their versions, so a second run is a no-op
# Prints two lines on stdout: `registry <path of docker-registry>` and `venv <path of the venv>`; exits 3 naming
# what is missing otherwise (the release tests then report NOT RUN with that reason).
set -euo pipefail

PYPISERVER_VERSION="${PYPISERVER_VERSION:-2.4.2}"
PASSLIB_VERSION="${PASSLIB_VERSION:-1.7.4}"
TWINE_VERSION="${TWINE_VERSION:-6.2.0}"
cache="${REPRIEVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/reprieve}"
mkdir -p "$cache"
say() { echo "install-release-tools: $*" >&2; }

if ! command -v docker-registry >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing Debian package docker-registry"
    start=$(date +%s)
    # policy-rc.d 101: the package's postinst must not start (or enable) a system-wide registry.
    policy=/usr/sbin/policy-rc.d
    had_policy=0; [ -e "$policy" ] && had_policy=1
    [ "$had_policy" = 1 ] || { printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod +x "$policy"; }
    ok=1
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        docker-registry; } >"$cache/apt-get-registry.log" 2>&1 || ok=0
    [ "$had_policy" = 1 ] || rm -f "$policy"
    if [ "$ok" = 0 ]; then
      tail -20 "$cache/apt-get-registry.log" >&2
      say "apt-get install docker-registry failed (log above, full log $cache/apt-get-registry.log)"
      exit 3
    fi
    say "installed in $(( $(date +%s) - start ))s"
  fi
fi
if ! command -v docker-registry >/dev/null 2>&1; then
  say "missing: docker-registry. On Debian 12 as root: apt-get install docker-registry"
  exit 3
fi

python="${PYTHON:-$(command -v python3.11 || command -v python3)}"
key="$(echo "$("$python" -c 'import sys; print(sys.version_info[:2])') pypiserver==$PYPISERVER_VERSION passlib==$PASSLIB_VERSION twine==$TWINE_VERSION" \
       | sha256sum | cut -c1-12)"
venv="$cache/release-venv-$key"
if [ ! -e "$venv/.complete" ]; then
  say "making $venv (pypiserver $PYPISERVER_VERSION, passlib $PASSLIB_VERSION, twine $TWINE_VERSION; once)"
  rm -rf "$venv"  # an unfinished one (no .complete): made again
  if ! { "$python" -m venv "$venv" \
         && "$venv/bin/python" -m pip install -q "pypiserver==$PYPISERVER_VERSION" "passlib==$PASSLIB_VERSION" \
              "twine==$TWINE_VERSION"; } >"$cache/release-venv.log" 2>&1; then
    tail -20 "$cache/release-venv.log" >&2
    say "pip install pypiserver passlib twine failed (log above, full log $cache/release-venv.log)"
    exit 3
  fi
  touch "$venv/.complete"
fi
echo "registry $(command -v docker-registry)"
echo "venv $venv"
