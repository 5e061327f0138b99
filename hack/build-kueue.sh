#!/usr/bin/env bash
# Builds Kueue's manager from its Go module (sigs.k8s.io/kueue/cmd/kueue), once, cached by version and Go version,
# and unpacks the same module's CRDs and webhook configuration beside it:
#   $cache/kueue/<version>-<go>/kueue      the manager binary
#   $cache/kueue/<version>-<go>/crd/       config/components/crd/bases/*.yaml of the same module
#   $cache/kueue/<version>-<go>/webhook/   config/components/webhook/manifests.yaml of the same module
# A second run is a no-op; a version bump (KUEUE_VERSION) rebuilds. Prints the directory on the last line.
# The build is a long compile on 2 cores (Kueue links every job integration it ships): run it under the heavy lock.
set -euo pipefail

KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"
cache="${REPRIEVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/reprieve}"

if ! command -v go >/dev/null 2>&1; then
  echo "build-kueue: 'go' not found on PATH. Install Go >= 1.25 (https://go.dev/doc/install) and rerun." >&2
  exit 1
fi
gov="$(go env GOVERSION)"
dir="$cache/kueue/$KUEUE_VERSION-$gov"
if [ -x "$dir/kueue" ] && [ -f "$dir/webhook/manifests.yaml" ] && [ -n "$(ls "$dir/crd" 2>/dev/null)" ]; then
  echo "$dir"
  exit 0
fi
mkdir -p "$dir"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
echo "build-kueue: building Kueue $KUEUE_VERSION from sigs.k8s.io/kueue (a long compile, once; cached in $dir)." >&2
start=$(date +%s)
tmp="$(mktemp -d)"
ldflags="-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION"
if ! GOBIN="$tmp" go install -trimpath -ldflags "$ldflags" "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"; then
  rm -rf "$tmp"
  echo "build-kueue: 'go install sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION' failed (output above). Check that" \
       "'go env GOPROXY' reaches the module proxy and that Go is >= the version in Kueue's go.mod." >&2
  exit 1
fi
# The CRDs and webhook manifests of exactly this module version (go install left it in the module cache).
moddir="$(go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
if [ -z "$moddir" ] || [ ! -d "$moddir/config/components/crd/bases" ]; then
  rm -rf "$tmp"
  echo "build-kueue: the module sigs.k8s.io/kueue@$KUEUE_VERSION has no config/components/crd/bases" \
       "(found dir '$moddir')." >&2
  exit 1
fi
rm -rf "$dir/crd" "$dir/webhook"
mkdir -p "$dir/crd" "$dir/webhook"
cp "$moddir"/config/components/crd/bases/*.yaml "$dir/crd/"
cp "$moddir/config/components/webhook/manifests.yaml" "$dir/webhook/manifests.yaml"
chmod -R u+w "$dir/crd" "$dir/webhook"
mv "$tmp/kueue" "$dir/kueue"
rm -rf "$tmp"
echo "build-kueue: Kueue $KUEUE_VERSION built in $(( $(date +%s) - start ))s" >&2
echo "$dir"
