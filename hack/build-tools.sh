#!/usr/bin/env bash
# Builds the local cluster's binaries from the official Go modules, once, cached by version:
#   localkube  kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, etcd and kubectl (hack/localkube)
#   helm       helm.sh/helm/v3/cmd/helm
# The cache key is the Go version plus a hash of hack/localkube's sources, so a second run is a no-op and a
# version bump rebuilds. Prints the bin directory on the last line: $cache/bin/<key>, whose links point at exactly this
# build, so worktrees with different hack/localkube sources can run clusters side by side (the links directly in
# $cache/bin follow whichever build ran last).
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.21.4}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${REPRIEVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/reprieve}"
bin="$cache/bin"
mkdir -p "$bin"

if ! command -v go >/dev/null 2>&1; then
  echo "build-tools: 'go' not found on PATH. Install Go >= 1.25 (https://go.dev/doc/install) and rerun." >&2
  exit 1
fi
gov="$(go env GOVERSION)"
kversion="$(sed -n 's/^const version = "\(.*\)"/\1/p' "$here/localkube/version.go")"
kminor="$(echo "$kversion" | cut -d. -f2)"
# The components report the release they are built from (Node .status.nodeInfo.kubeletVersion, /version).
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$kversion -X k8s.io/component-base/version.gitMajor=1"
ldflags+=" -X k8s.io/component-base/version.gitMinor=$kminor -X k8s.io/component-base/version.gitTreeState=clean"
key="$( (echo "$gov $ldflags"; cat "$here/localkube/go.mod" "$here/localkube/go.sum" "$here/localkube/"*.go) | sha256sum | cut -c1-12)"
localkube="$bin/localkube-$key"

export GOFLAGS="${GOFLAGS:--buildvcs=false}"
if [ ! -x "$localkube" ]; then
  echo "build-tools: building localkube (Kubernetes control plane, kubelet, etcd, kubectl; key $key)." >&2
  echo "build-tools: the first build of these binaries and helm takes about 10 minutes on an idle 2-core machine (27 on a loaded one), and all that make test builds the first time about 26 (measured: benchmarks/RESULTS.md, First build); later runs reuse $localkube." >&2
  start=$(date +%s)
  if ! (cd "$here/localkube" && go build -trimpath -ldflags "$ldflags" -o "$localkube.tmp" .); then
    echo "build-tools: the Go build of hack/localkube failed (output above). Check 'go env GOPROXY' reaches" \
         "the module proxy and that Go is >= the version in hack/localkube/go.mod." >&2
    exit 1
  fi
  mv "$localkube.tmp" "$localkube"
  echo "build-tools: localkube built in $(( $(date +%s) - start ))s" >&2
fi
ln -sfn "$(basename "$localkube")" "$bin/localkube"
for c in kube-apiserver kube-controller-manager kube-scheduler kubelet etcd kubectl; do
  ln -sfn localkube "$bin/$c"
done

# go_install PACKAGE@VERSION DEST: `go install` one command into DEST (the binary's cached, versioned path).
go_install() {
  local tmp
  tmp="$(mktemp -d)"
  if ! GOBIN="$tmp" go install -trimpath -ldflags "-s -w" "$1"; then
    rm -rf "$tmp"
    echo "build-tools: 'go install $1' failed (output above)." >&2
    exit 1
  fi
  mv "$tmp/$(basename "${1%@*}")" "$2"
  rm -rf "$tmp"
}

helm="$bin/helm-$HELM_VERSION"
if [ ! -x "$helm" ]; then
  echo "build-tools: building helm $HELM_VERSION from helm.sh/helm/v3 (a few minutes, once)." >&2
  start=$(date +%s)
  go_install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" "$helm"
  echo "build-tools: helm built in $(( $(date +%s) - start ))s" >&2
fi
ln -sfn "$(basename "$helm")" "$bin/helm"

# actionlint: lints .github/workflows in `make verify` (a small Go build, once).
ACTIONLINT_VERSION="${ACTIONLINT_VERSION:-v1.7.12}"
actionlint="$bin/actionlint-$ACTIONLINT_VERSION"
if [ ! -x "$actionlint" ]; then
  echo "build-tools: building actionlint $ACTIONLINT_VERSION (once)." >&2
  go_install "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION" "$actionlint"
fi
keyed="$bin/$key"
mkdir -p "$keyed"
ln -sfn "../$(basename "$localkube")" "$keyed/localkube"
ln -sfn "../$(basename "$helm")" "$keyed/helm"
ln -sfn "../$(basename "$actionlint")" "$keyed/actionlint"
for c in kube-apiserver kube-controller-manager kube-scheduler kubelet etcd kubectl; do
  ln -sfn localkube "$keyed/$c"
done
echo "$keyed"
