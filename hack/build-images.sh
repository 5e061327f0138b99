#!/usr/bin/env bash
# Builds the images of the local cluster's real nodes, once, cached by content hash under ~/.cache/reprieve/images:
#   base      a Debian bookworm rootfs with python3 + venv, made by mmdebstrap from Debian packages (no registry)
#   pause     the pod sandbox image: hack/images/pause.c, static, FROM scratch
#   operator  operator/Dockerfile   (BASE = the base above; on a registry host the same file builds FROM python)
#   example   examples/Dockerfile   (the example trainer)
# Builds run daemonless with podman (buildah) in a storage of our own (~/.cache/reprieve/containers), never the
# host's default one, and RUN steps use the host network only to reach the package registries (pip).
# Each image is saved as a docker-archive that hack/localcluster/realnode.py imports into every real node's
# containerd. Prints one line per image on stdout: `<name> <image reference> <archive path>`.
#
# Missing Debian packages are installed with apt-get when running as root on Debian; otherwise the script
# names them and exits 3 (the real-node test tier then reports NOT RUN with that message).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
cache="${REPRIEVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/reprieve}"
images="$cache/images"
mkdir -p "$images"
SUITE=bookworm
BASE_PACKAGES=python3,python3-venv,ca-certificates
# What the real-node tier needs on the host: the image builders and the node runtime (iptables: the soak's
# partition fault, DROP rules in a pod's network namespace).
PACKAGES=(podman buildah mmdebstrap containerd runc containernetworking-plugins iproute2 util-linux gcc libc6-dev
          iptables)
COMMANDS=(podman mmdebstrap containerd containerd-shim-runc-v2 runc ctr /usr/lib/cni/bridge /usr/lib/cni/host-local
          /usr/lib/cni/loopback ip unshare nsenter gcc iptables-restore)

say() { echo "build-images: $*" >&2; }

missing() {
  local m=()
  for c in "${COMMANDS[@]}"; do
    if [[ "$c" == /* ]]; then [ -x "$c" ] || m+=("$c"); else command -v "$c" >/dev/null 2>&1 || m+=("$c"); fi
  done
  [ -e /usr/lib/x86_64-linux-gnu/libc.a ] || [ -e /usr/lib/aarch64-linux-gnu/libc.a ] || m+=("libc.a")
  echo "${m[*]:-}"
}

lacking="$(missing)"
if [ -n "$lacking" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing Debian packages for the real-node tier (missing: $lacking): ${PACKAGES[*]}"
    start=$(date +%s)
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
             "${PACKAGES[@]}"; } >"$cache/apt-get.log" 2>&1; then
      tail -20 "$cache/apt-get.log" >&2
      say "apt-get install ${PACKAGES[*]} failed (log above, full log $cache/apt-get.log)."
      exit 3
    fi
    say "packages installed in $(( $(date +%s) - start ))s"
    lacking="$(missing)"
  fi
  if [ -n "$lacking" ]; then
    say "missing: $lacking. On Debian 12 as root: apt-get install ${PACKAGES[*]}"
    exit 3
  fi
fi

# podman/buildah with a storage and configuration of their own: runc (crun cannot run on hybrid cgroups), the
# machine's hard limits for open files and processes, no host-wide state touched.
ctr_dir="$cache/containers"
mkdir -p "$ctr_dir/storage" "$ctr_dir/run"
cat >"$ctr_dir/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$ctr_dir/storage"
runroot = "$ctr_dir/run"
EOF
cat >"$ctr_dir/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
export CONTAINERS_STORAGE_CONF="$ctr_dir/storage.conf" CONTAINERS_CONF="$ctr_dir/containers.conf"
# pip inside RUN steps trusts what the host's pip trusts (a site's TLS-inspecting proxy CA included): the host's
# CA bundle and a pip.conf naming it are mounted for the build only and never land in an image.
build_mounts=()
host_ca="${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}"
if [ -s "$host_ca" ]; then
  printf '[global]\ncert = /run/reprieve-host-ca.crt\n' >"$ctr_dir/pip.conf"
  build_mounts=(--volume "$host_ca:/run/reprieve-host-ca.crt:ro" --volume "$ctr_dir/pip.conf:/etc/pip.conf:ro")
fi
podman() { command podman --cgroup-manager=cgroupfs "$@"; }

hash_files() { # hash_files PATH... -> 12 hex chars over the names and contents of every file under PATHs
  (cd "$repo" && find "$@" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | LC_ALL=C sort -z \
     | xargs -0 sha256sum) | sha256sum | cut -c1-12
}

have_image() { podman image exists "$1"; }

save() { # save NAME REF ARCHIVE: write the docker-archive (atomically) if it is not there yet
  local name="$1" ref="$2" archive="$3"
  if [ ! -s "$archive" ]; then
    podman save -q --format docker-archive -o "$archive.tmp" "$ref" >/dev/null
    mv "$archive.tmp" "$archive"
  fi
  # Older builds of this image: their archives and tags go (the layer cache of the current build stays).
  local old
  for old in "$images/$(basename "${archive%_*}")"_*.tar; do
    [ "$old" = "$archive" ] || rm -f "$old" "${old%.tar}.build.log"
  done
  podman images --format '{{.Repository}}:{{.Tag}}' "${ref%%:*}" 2>/dev/null | while read -r tagged; do
    [ "$tagged" = "$ref" ] || podman rmi "$tagged" >/dev/null 2>&1 || true
  done
  # build stages of builds older than a day (the newest ones stay: they are the layer cache of the next build)
  podman image prune -f --filter until=24h >/dev/null 2>&1 || true
  echo "$name $ref $archive"
}

build() { # build NAME REF DOCKERFILE [podman build args...]: build unless cached, then save
  local name="$1" ref="$2" file="$3"; shift 3
  local archive="$images/${ref//[\/:]/_}.tar"
  if [ ! -s "$archive" ] || ! have_image "$ref"; then
    say "building $ref from ${file#"$repo"/} (once; cached by content hash)"
    local start log
    start=$(date +%s)
    log="$images/${ref//[\/:]/_}.build.log"
    if ! podman build --pull=never --network=host --layers "${build_mounts[@]}" -f "$file" -t "$ref" "$@" >"$log" 2>&1; then
      tail -30 "$log" >&2
      say "podman build of $ref from $file failed (log above, full log $log)"
      exit 1
    fi
    rm -f "$archive"
    say "$ref built in $(( $(date +%s) - start ))s"
  fi
  save "$name" "$ref" "$archive"
}

# -- base: Debian rootfs from packages --------------------------------------------------------------------
base_key="$(echo "$SUITE minbase $BASE_PACKAGES nodocs v1" | sha256sum | cut -c1-12)"
base_ref="localhost/reprieve-base:$base_key"
if ! have_image "$base_ref"; then
  rootfs="$images/base-$base_key.tar"
  if [ ! -s "$rootfs" ]; then
    say "making the base rootfs with mmdebstrap ($SUITE minbase + $BASE_PACKAGES; once)"
    start=$(date +%s)
    if ! mmdebstrap --quiet --variant=minbase --include="$BASE_PACKAGES" \
           --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
           --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
           "$SUITE" "$rootfs.tmp.tar" >"$images/base.log" 2>&1; then
      tail -30 "$images/base.log" >&2
      say "mmdebstrap $SUITE failed (log above): it needs the Debian mirror reachable (apt-get works?)"
      exit 1
    fi
    mv "$rootfs.tmp.tar" "$rootfs"
    say "base rootfs made in $(( $(date +%s) - start ))s"
  fi
  podman import -q --change 'CMD ["/bin/bash"]' "$rootfs" "$base_ref" >/dev/null
fi

# -- pause ------------------------------------------------------------------------------------------------
pause_key="$(hash_files hack/images)"
pause_ctx="$images/pause-ctx"
if [ ! -s "$images/reprieve.local_pause_$pause_key.tar" ]; then
  rm -rf "$pause_ctx" && mkdir -p "$pause_ctx"
  gcc -Os -static -o "$pause_ctx/pause" "$here/images/pause.c"
  cp "$here/images/pause.Containerfile" "$pause_ctx/Containerfile"
fi
build pause "reprieve.local/pause:$pause_key" "$pause_ctx/Containerfile" "$pause_ctx"

# -- operator and example ---------------------------------------------------------------------------------
context=(pyproject.toml operator/pyproject.toml requirements README.md .dockerignore runtime/reprieve operator/reprieve_operator)
op_key="$( (echo "$base_key"; hash_files operator/Dockerfile "${context[@]}") | sha256sum | cut -c1-12)"
build operator "reprieve.local/reprieve-operator:$op_key" "$repo/operator/Dockerfile" \
  --build-arg "BASE=$base_ref" "$repo"
ex_key="$( (echo "$base_key"; hash_files examples "${context[@]}") | sha256sum | cut -c1-12)"
build example "reprieve.local/reprieve-example:$ex_key" "$repo/examples/Dockerfile" \
  --build-arg "BASE=$base_ref" "$repo"
