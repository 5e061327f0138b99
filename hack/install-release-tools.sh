#!/usr/bin/env bash
# What the local release path needs (hack/release.py, hack/localcluster/registry.py), once, cached by version:
#   docker-registry  Debian 12's package (the CNCF distribution registry 2.8), apt-get when missing and running as
#                    root on Debian; its service is never started (the cluster runs the binary on loopback with a
#                    configuration of its own)
#   gpg              Debian 12's gnupg, apt-get when missing (as above): the release tests make throwaway keys to
#                    sign the chart (hack/release.py publish --sign-key) and verify it (install --verify-keyring)
#   a venv           $cache/release-venv-<key>: pypiserver (the package index), passlib (its htpasswd) and twine
#                    (the upload client), pinned below; the key is their versions, so a second run is a no-op
#   a wheelhouse     $cache/wheelhouse-<key> (with --wheelhouse; `make release-tier`): every distribution of
#                    requirements/operator.lock and requirements/example.lock (jax, tensorstore, kopf, ...) for this
#                    Python and machine, `pip download`ed from PyPI once; the key is the locks' content. The local
#                    package index serves it beside what a release uploads, so `pip install reprieve[runtime]` and
#                    `reprieve-operator` from that index need nothing else (the release tests talk to loopback only)
# Prints on stdout `registry <path of docker-registry>`, `venv <path of the venv>` and, once it is complete,
# `wheelhouse <dir>`; exits 3 naming what is missing otherwise (the release tests then report NOT RUN with that
# reason).
set -euo pipefail

PYPISERVER_VERSION="${PYPISERVER_VERSION:-2.4.2}"
PASSLIB_VERSION="${PASSLIB_VERSION:-1.7.4}"
TWINE_VERSION="${TWINE_VERSION:-6.2.0}"
want_wheelhouse=0
[ "${1:-}" = --wheelhouse ] && want_wheelhouse=1
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${REPRIEVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/reprieve}"
mkdir -p "$cache"
say() { echo "install-release-tools: $*" >&2; }

# shellcheck source=hack/apt-package.sh
source "$(dirname "${BASH_SOURCE[0]}")/apt-package.sh"
ensure_apt_package docker-registry apt-get-registry.log
ensure_apt_package gnupg apt-get-gnupg.log gpg

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

locks=("$repo/requirements/operator.lock" "$repo/requirements/example.lock")
wkey="$( { "$venv/bin/python" -c 'import sys, platform; print(sys.version_info[:2], platform.machine())'; \
           cat "${locks[@]}"; } | sha256sum | cut -c1-12)"
wheelhouse="$cache/wheelhouse-$wkey"
if [ "$want_wheelhouse" = 1 ] && [ ! -e "$wheelhouse/.complete" ]; then
  say "downloading the locks' distributions into $wheelhouse (from PyPI; once per content of the locks)"
  rm -rf "$wheelhouse"; : >"$cache/wheelhouse.log"
  for lock in "${locks[@]}"; do  # one at a time: the two locks pin some of the same distributions
    if ! "$venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
         -r "$lock" -d "$wheelhouse" >>"$cache/wheelhouse.log" 2>&1; then
      tail -20 "$cache/wheelhouse.log" >&2
      say "pip download -r $lock failed (log above, full log $cache/wheelhouse.log)"
      exit 3
    fi
  done
  touch "$wheelhouse/.complete"
fi
echo "registry $(command -v docker-registry)"
echo "venv $venv"
if [ -e "$wheelhouse/.complete" ]; then echo "wheelhouse $wheelhouse"; fi
