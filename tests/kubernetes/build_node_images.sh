#!/usr/bin/env bash
# Build the container images of the real test node (issue 15), with podman, and export
# each as a docker-archive that `ctr -n k8s.io images import` takes:
#   base   Debian bookworm from `debootstrap --variant=minbase` (no image can be pulled
#          here), with python3, python3-venv, python3-pip and ca-certificates;
#   pause  the pod sandbox's image: FROM scratch + the static pause binary of
#          build_node.sh (run that first; `make test-node` does);
#   job    deploy/Dockerfile built FROM base, installing our wheel into a venv;
#   notebook  deploy/notebook.Dockerfile built FROM job: JupyterLab for a notebook pod
#          (deploy/notebook.yaml). Its archive holds every layer of job's too: the tests
#          that need it import it into the node themselves (node.py: `ensure_image`).
#
# Also installs, with apt-get and only when missing, what the node needs: podman,
# buildah, runc, containerd, containernetworking-plugins, debootstrap.
#
# Cached under $ELASTICDL_NB_CACHE/node-images (default ~/.cache/elasticdl-nb), keyed by
# content: base by its debootstrap recipe, pause by pause.c, job by deploy/Dockerfile,
# the base's key and the files the wheel is built from (hatchling's selection: the
# package, the built JupyterLab extension, jupyter-config/, pyproject.toml, README.md),
# notebook by the job's key and deploy/notebook.Dockerfile.
# A warm run hashes those and returns in about a second. A stale job archive is deleted
# when a new one is written (each is ~1 GB). `images.env` in the cache names the current
# images and archives, for the tests.
#
# podman runs with a private configuration (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF:
# its storage, run and tmp dirs all in the cache); the machine's /etc/containers is not
# changed. That configuration sets what this machine needs (see FACTS): the runc runtime
# (crun refuses hybrid cgroups), explicit ulimits (root cannot raise the open-files hard
# limit to podman's default), cgroupfs (no systemd). Builds use the host network, so no
# CNI bridge or iptables rule is made, and mount the host's CA bundle for pip.
set -euo pipefail
. "$(dirname "$0")/debian_mirror.sh"

REPO="$(cd "$(dirname "$0")/../.." && pwd)"
CACHE_ROOT="${ELASTICDL_NB_CACHE:-$HOME/.cache/elasticdl-nb}"
OUT="$CACHE_ROOT/node-images"
K8S_ROOT="$CACHE_ROOT/k8s-1.20.2"
PAUSE_BIN="$K8S_ROOT/bin/pause"
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
SUITE=bookworm
BASE_PACKAGES=python3,python3-venv,python3-pip,ca-certificates
HOST_PACKAGES=(podman buildah runc containerd containernetworking-plugins debootstrap dnsmasq-base)

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
T0=$SECONDS
step() { echo "== [$((SECONDS - T0))s] $*"; }
sha() { sha256sum | cut -c1-16; }
mkdir -p "$OUT"

# --- host packages -------------------------------------------------------------------
missing=()
for p in "${HOST_PACKAGES[@]}"; do
    [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" = installed ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    step "apt-get install ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# --- keys ----------------------------------------------------------------------------
# Bump a recipe's version when its steps below change in a way its inputs do not show.
BASE_RECIPE="v1 debootstrap --variant=minbase --include=$BASE_PACKAGES $SUITE; apt caches emptied"
BASE_KEY="$(echo "$BASE_RECIPE" | sha)"

SRC="$(find "$K8S_ROOT/src" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes-*' 2>/dev/null | head -1)"
PAUSE_C="$SRC/build/pause/linux/pause.c"
[ -n "$SRC" ] && [ -f "$PAUSE_C" ] && [ -x "$PAUSE_BIN" ] || {
    echo "no pause binary or source: run tests/kubernetes/build_node.sh first" >&2
    exit 1
}
PAUSE_KEY="$( (echo "v1 FROM scratch, static gcc -Os"; cat "$PAUSE_C") | sha)"

labext="$REPO/elasticdl_nb/labextension"
[ -f "$labext/static/style.js" ] && [ -f "$labext/install.json" ] || {
    echo "the JupyterLab extension is not built ($labext): run \`make labextension\`" >&2
    echo "(the wheel must carry it, so that installing the wheel needs no Node.js)" >&2
    exit 1
}
wheel_inputs() {
    cd "$REPO"
    {
        git ls-files -z --cached --others --exclude-standard -- \
            elasticdl_nb jupyter-config pyproject.toml README.md
        find elasticdl_nb/labextension -type f -print0
    } | sort -zu | while IFS= read -r -d '' f; do
        # Compiled caches are not part of a wheel (hatchling leaves them out too).
        case "$f" in *.pyc | */__pycache__/*) continue ;; esac
        [ -f "$f" ] && printf '%s %s\n' "$(sha256sum <"$f" | cut -c1-64)" "$f"
    done
}
JOB_KEY="$( (echo "v1 base=$BASE_KEY"; cat "$REPO/deploy/Dockerfile"; wheel_inputs) | sha)"
NOTEBOOK_KEY="$( (echo "v1 job=$JOB_KEY"; cat "$REPO/deploy/notebook.Dockerfile") | sha)"

BASE_IMAGE="localhost/elasticdl-nb-base:$BASE_KEY"
PAUSE_IMAGE="localhost/pause:3.4-$PAUSE_KEY"
JOB_IMAGE="localhost/elasticdl-nb:$JOB_KEY"
BASE_ARCHIVE="$OUT/base-$BASE_KEY.tar"
PAUSE_ARCHIVE="$OUT/pause-$PAUSE_KEY.tar"
JOB_ARCHIVE="$OUT/job-$JOB_KEY.tar"
JOB_SIZE_FILE="$OUT/job-$JOB_KEY.size"
NOTEBOOK_IMAGE="localhost/elasticdl-nb-notebook:$NOTEBOOK_KEY"
NOTEBOOK_ARCHIVE="$OUT/notebook-$NOTEBOOK_KEY.tar"
NOTEBOOK_SIZE_FILE="$OUT/notebook-$NOTEBOOK_KEY.size"

write_env() {
    cat >"$OUT/images.env.tmp" <<EOF
# Written by tests/kubernetes/build_node_images.sh: the current node images.
BASE_IMAGE=$BASE_IMAGE
BASE_ARCHIVE=$BASE_ARCHIVE
PAUSE_IMAGE=$PAUSE_IMAGE
PAUSE_ARCHIVE=$PAUSE_ARCHIVE
JOB_IMAGE=$JOB_IMAGE
JOB_ARCHIVE=$JOB_ARCHIVE
JOB_IMAGE_SIZE=$(cat "$JOB_SIZE_FILE")
NOTEBOOK_IMAGE=$NOTEBOOK_IMAGE
NOTEBOOK_ARCHIVE=$NOTEBOOK_ARCHIVE
NOTEBOOK_IMAGE_SIZE=$(cat "$NOTEBOOK_SIZE_FILE")
EOF
    mv "$OUT/images.env.tmp" "$OUT/images.env"
}
report() {
    local size
    size="$(cat "$JOB_SIZE_FILE")"
    echo "job image $JOB_IMAGE: $((size / 1024 / 1024)) MiB unpacked," \
        "archive $(($(stat -c %s "$JOB_ARCHIVE") / 1024 / 1024)) MiB ($JOB_ARCHIVE)"
    local notebook
    notebook="$(cat "$NOTEBOOK_SIZE_FILE")"
    echo "notebook image $NOTEBOOK_IMAGE: $((notebook / 1024 / 1024)) MiB unpacked," \
        "$(((notebook - size) / 1024 / 1024)) MiB more than the job image's layers"
    echo "pause image $PAUSE_IMAGE ($PAUSE_ARCHIVE)"
    echo "images listed in $OUT/images.env"
}

if [ -f "$BASE_ARCHIVE" ] && [ -f "$PAUSE_ARCHIVE" ] && [ -f "$JOB_ARCHIVE" ] && [ -f "$JOB_SIZE_FILE" ] \
    && [ -f "$NOTEBOOK_ARCHIVE" ] && [ -f "$NOTEBOOK_SIZE_FILE" ]; then
    write_env
    report
    exit 0
fi

# --- podman, privately configured ----------------------------------------------------
PODMAN_DIR="$OUT/podman"
mkdir -p "$PODMAN_DIR/storage" "$PODMAN_DIR/run" "$PODMAN_DIR/tmp"
cat >"$PODMAN_DIR/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "none"
tmp_dir = "$PODMAN_DIR/tmp"

[network]
network_config_dir = "$PODMAN_DIR/networks"
EOF
cat >"$PODMAN_DIR/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$PODMAN_DIR/storage"
runroot = "$PODMAN_DIR/run"
EOF
export CONTAINERS_CONF="$PODMAN_DIR/containers.conf"
export CONTAINERS_STORAGE_CONF="$PODMAN_DIR/storage.conf"

# What podman and buildah still make outside that configuration: runc's default root,
# netavark's run dir, the blob-info cache of image copies. Removed again at the end when
# they were not there before.
HOST_STATE=(/run/runc /run/containers /var/lib/containers)
host_state_before=()
for d in "${HOST_STATE[@]}"; do [ ! -e "$d" ] || host_state_before+=("$d"); done

WORK="$(mktemp -d "$OUT/work.XXXXXX")"
cleanup() {
    # Nothing of a build may stay mounted: debootstrap's /proc and /sys in the rootfs,
    # or an overlay of podman's storage.
    local m
    for m in $(awk -v w="$WORK" -v p="$PODMAN_DIR" \
        'index($2, w) == 1 || index($2, p) == 1 { print $2 }' /proc/self/mounts | sort -r); do
        $SUDO umount -l "$m" 2>/dev/null || true
    done
    $SUDO rm -rf "$WORK"
    local d
    for d in "${HOST_STATE[@]}"; do
        case " ${host_state_before[*]} " in *" $d "*) ;; *) $SUDO rm -rf "$d" ;; esac
    done
}
trap cleanup EXIT

ensure_loaded() {  # image archive
    podman image exists "$1" || podman load -q -i "$2" >/dev/null
}
save() {  # image archive
    podman save -q --format docker-archive -o "$2.tmp" "$1"
    mv "$2.tmp" "$2"
}

# --- base: debootstrap + podman import -----------------------------------------------
if [ ! -f "$BASE_ARCHIVE" ]; then
    . /etc/os-release
    mirror="$(debian_mirror)"
    step "debootstrap $SUITE from $mirror (~2 min)"
    rootfs="$WORK/rootfs"
    $SUDO debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$rootfs" "$mirror" \
        >"$WORK/debootstrap.log" 2>&1 || {
        tail -30 "$WORK/debootstrap.log" >&2
        echo "debootstrap failed" >&2
        exit 1
    }
    $SUDO rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
        "$rootfs"/debootstrap
    step "podman import $BASE_IMAGE"
    $SUDO tar -C "$rootfs" --numeric-owner -c . | podman import -q \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null
    save "$BASE_IMAGE" "$BASE_ARCHIVE"
    $SUDO rm -rf "$rootfs"
fi

# --- pause ---------------------------------------------------------------------------
if [ ! -f "$PAUSE_ARCHIVE" ]; then
    step "build $PAUSE_IMAGE"
    ctx="$WORK/pause"
    mkdir -p "$ctx"
    cp "$PAUSE_BIN" "$ctx/pause"
    printf 'FROM scratch\nCOPY pause /pause\nENTRYPOINT ["/pause"]\n' >"$ctx/Containerfile"
    podman build -q --network=none -f "$ctx/Containerfile" -t "$PAUSE_IMAGE" "$ctx" >/dev/null
    save "$PAUSE_IMAGE" "$PAUSE_ARCHIVE"
fi

# --- job: our wheel, then deploy/Dockerfile FROM base --------------------------------
ctx="$WORK/job"  # the wheel, for both images
wheel() {
    [ -d "$ctx/dist" ] && return
    local py=python3
    [ -x "$REPO/.venv/bin/python" ] && py="$REPO/.venv/bin/python"
    step "wheel of $REPO"
    # The extension is built (checked above), so hatch-jupyter-builder skips npm.
    "$py" -m pip wheel -q --no-deps -w "$ctx/dist" "$REPO" >"$WORK/wheel.log" 2>&1 || {
        cat "$WORK/wheel.log" >&2
        exit 1
    }
    ls "$ctx/dist"
}
if [ ! -f "$JOB_ARCHIVE" ] || [ ! -f "$JOB_SIZE_FILE" ]; then
    wheel
    ensure_loaded "$BASE_IMAGE" "$BASE_ARCHIVE"
    step "podman build $JOB_IMAGE from deploy/Dockerfile (cold: pip installs TensorFlow, ~3 min)"
    podman build --network=host -v "$CA_BUNDLE:$CA_BUNDLE:ro" \
        --build-arg "BASE=$BASE_IMAGE" -f "$REPO/deploy/Dockerfile" -t "$JOB_IMAGE" "$ctx" \
        >"$WORK/build.log" 2>&1 || {
        tail -40 "$WORK/build.log" >&2
        echo "podman build failed" >&2
        exit 1
    }
    podman image inspect --format '{{.Size}}' "$JOB_IMAGE" >"$JOB_SIZE_FILE"
    step "podman save $JOB_IMAGE"
    save "$JOB_IMAGE" "$JOB_ARCHIVE"
fi

# --- notebook: deploy/notebook.Dockerfile FROM job ----------------------------------
if [ ! -f "$NOTEBOOK_ARCHIVE" ] || [ ! -f "$NOTEBOOK_SIZE_FILE" ]; then
    wheel
    ensure_loaded "$JOB_IMAGE" "$JOB_ARCHIVE"
    step "podman build $NOTEBOOK_IMAGE from deploy/notebook.Dockerfile (cold: ~1 min)"
    podman build --network=host -v "$CA_BUNDLE:$CA_BUNDLE:ro" \
        --build-arg "JOB_IMAGE=$JOB_IMAGE" -f "$REPO/deploy/notebook.Dockerfile" \
        -t "$NOTEBOOK_IMAGE" "$ctx" >"$WORK/notebook-build.log" 2>&1 || {
        tail -40 "$WORK/notebook-build.log" >&2
        echo "podman build failed" >&2
        exit 1
    }
    podman image inspect --format '{{.Size}}' "$NOTEBOOK_IMAGE" >"$NOTEBOOK_SIZE_FILE"
    step "podman save $NOTEBOOK_IMAGE"
    save "$NOTEBOOK_IMAGE" "$NOTEBOOK_ARCHIVE"
fi

# Only the current images are kept, archives and tags (the job image's layers below the
# wheel stay cached in podman's storage for the next build).
for f in "$OUT"/base-*.tar "$OUT"/pause-*.tar "$OUT"/job-*.tar "$OUT"/job-*.size \
    "$OUT"/notebook-*.tar "$OUT"/notebook-*.size; do
    case "$f" in "$BASE_ARCHIVE" | "$PAUSE_ARCHIVE" | "$JOB_ARCHIVE" | "$JOB_SIZE_FILE" | \
        "$NOTEBOOK_ARCHIVE" | "$NOTEBOOK_SIZE_FILE") ;;
    *) rm -f "$f" ;; esac
done
for repo in localhost/elasticdl-nb-base localhost/pause localhost/elasticdl-nb \
    localhost/elasticdl-nb-notebook; do
    for img in $(podman images --format '{{.Repository}}:{{.Tag}}' "$repo"); do
        case "$img" in "$BASE_IMAGE" | "$PAUSE_IMAGE" | "$JOB_IMAGE" | "$NOTEBOOK_IMAGE") ;;
        *) podman rmi -f "$img" >/dev/null || true ;; esac
    done
done
podman image prune -f >/dev/null || true

step "done"
write_env
report
