#!/usr/bin/env bash
# Build the binaries of a real test node, beside the test cluster's (issue 15):
#   kubelet, kube-scheduler and kube-proxy v1.20.2, from the same Debian `kubernetes`
#   source tree and Go caches as build_cluster_binaries.sh (which this script runs
#   with their names), and `pause`, the pod sandbox's process: a static build of the
#   tree's build/pause/linux/pause.c, which build_node_images.sh puts in an image.
#
# Everything lands in $ELASTICDL_NB_CACHE/k8s-1.20.2/bin (default ~/.cache/elasticdl-nb),
# never in the repo. Idempotent: when the four binaries exist it returns at once. With
# the source tree and Go cache of the cluster build present, a cold build takes ~2 min
# (kubelet ~70 s, scheduler ~25 s, kube-proxy ~10 s); on a fresh machine the source
# download and the shared packages' build come first (~8 min more).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE_ROOT="${ELASTICDL_NB_CACHE:-$HOME/.cache/elasticdl-nb}"
ROOT="$CACHE_ROOT/k8s-1.20.2"
BIN="$ROOT/bin"
NODE_BINARIES=(kubelet kube-scheduler kube-proxy)

have_all() {
    local b
    for b in "${NODE_BINARIES[@]}" pause; do [ -x "$BIN/$b" ] || return 1; done
}
# tcpdump: the TLS test captures the pods' traffic on the node's bridge (issue 20).
if ! command -v tcpdump >/dev/null; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    echo "== apt-get install tcpdump"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq tcpdump >/dev/null
fi

if have_all; then
    echo "${NODE_BINARIES[*]} pause present in $BIN"
    exit 0
fi

bash "$HERE/build_cluster_binaries.sh" "${NODE_BINARIES[@]}"

# --- pause: static C, as the upstream Makefile builds it (build/pause/Makefile) --------
if [ ! -x "$BIN/pause" ]; then
    SRC="$(find "$ROOT/src" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes-*' | head -1)"
    PAUSE_C="$SRC/build/pause/linux/pause.c"
    [ -f "$PAUSE_C" ] || { echo "no $PAUSE_C" >&2; exit 1; }
    # gcc and a static libc (libc.a is in libc6-dev); installed only when missing.
    need_pkgs=()
    command -v gcc >/dev/null || need_pkgs+=(gcc)
    [ -f /usr/lib/x86_64-linux-gnu/libc.a ] || [ -n "$(find /usr/lib -name libc.a -print -quit)" ] \
        || need_pkgs+=(libc6-dev)
    if [ ${#need_pkgs[@]} -gt 0 ]; then
        SUDO=""
        [ "$(id -u)" -eq 0 ] || SUDO=sudo
        echo "== apt-get install ${need_pkgs[*]}"
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
    fi
    tag="$(sed -n 's/^TAG *= *//p' "$SRC/build/pause/Makefile")"
    gcc -Os -Wall -Werror -static -DVERSION="v${tag:-3.4}-debian-bookworm" \
        -o "$BIN/pause.tmp" "$PAUSE_C"
    strip "$BIN/pause.tmp" 2>/dev/null || true
    mv "$BIN/pause.tmp" "$BIN/pause"
    echo "built pause ($("$BIN/pause" -v 2>&1 | head -1)) from $PAUSE_C"
fi

have_all
echo "node binaries: $(cd "$BIN" && ls "${NODE_BINARIES[@]}" pause | tr '\n' ' ')in $BIN"
