"""What a container sees under the test kubelet (kubelet.py): its environment, and its
volumes at their real mount paths.

The volumes are bind-mounted in a private mount namespace (`unshare --mount`), made by
the command line `sandbox_argv` builds, so the process finds e.g. its service-account
token at /var/run/secrets/kubernetes.io/serviceaccount as in a real pod, while the host
and the other pods do not see the mounts. A mount point missing on the host is made
(empty) first and listed in `MOUNT_POINTS`, for `remove_mount_points` to take away.

Removing a mount point unmounts it in the pods of any kubelet that mount there, even in
another test session. So a process making mount points holds a shared flock on that
file, and they are removed only by a process that can take it exclusively: the last.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import re
import shlex
import sys
import tempfile
import threading
from pathlib import Path

from kubernetes.client.rest import ApiException

from tests.kubernetes.kubelet_status import HOST_IP

# The volume kinds supported, for the error on the others.
VOLUME_KINDS = ("configMap", "secret", "emptyDir", "hostPath")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

MOUNT_POINTS = Path(tempfile.gettempdir()) / "elasticdl-nb-test-kubelet-mount-points"

_lock = threading.Lock()
_fd: int | None = None  # MOUNT_POINTS, flocked shared while this process has pods


class ContainerConfigError(Exception):
    """A Secret, ConfigMap or key the container needs is missing, or a volume is of a kind
    the test kubelet does not support: reported as CreateContainerConfigError."""


def prepare(core, pod: dict, ip: str, api_port: int, pod_dir: Path) -> tuple[list[str], dict]:
    """The command line and environment that run the pod's (first) container with pod IP
    `ip`; `pod_dir` holds its home directory, volumes and termination message file."""
    container = pod["spec"]["containers"][0]
    (pod_dir / "home").mkdir(parents=True, exist_ok=True)
    base = {
        "PATH": f"{Path(sys.executable).parent}:{SYSTEM_PATH}",  # "python": the venv's
        "HOME": str(pod_dir / "home"),
        "HOSTNAME": pod["metadata"]["name"],
        # The API server on loopback: where in-cluster config finds it.
        "KUBERNETES_SERVICE_HOST": HOST_IP,
        "KUBERNETES_SERVICE_PORT": str(api_port),
        "KUBERNETES_SERVICE_PORT_HTTPS": str(api_port),
    }
    status = {**pod.get("status", {}), "podIP": ip, "hostIP": HOST_IP}
    env = container_env(core, {**pod, "status": status}, container, base)
    mounts = volume_mounts(core, pod, container, pod_dir / "volumes")
    if container.get("terminationMessagePath"):
        (pod_dir / "termination-log").touch()
        mounts.append((pod_dir / "termination-log", container["terminationMessagePath"], False))
    make_mount_points(mounts)
    command = (container.get("command") or []) + (container.get("args") or [])
    if not command:
        raise ContainerConfigError("the test kubelet knows no image's entrypoint: set command")
    return sandbox_argv(mounts, command, container.get("workingDir")), env


def termination_message(pod: dict, pod_dir: Path, log: Path, code: int) -> str:
    """What the container wrote to its terminationMessagePath; or, if it failed and its
    policy says so, the end of its log."""
    path = pod_dir / "termination-log"
    message = path.read_text(errors="replace")[:4096] if path.exists() else ""
    policy = pod["spec"]["containers"][0].get("terminationMessagePolicy")
    if not message and code and policy == "FallbackToLogsOnError":
        message = "\n".join(log.read_text(errors="replace").splitlines()[-80:])[-2048:]
    return message


# --- Secrets and ConfigMaps ------------------------------------------------------------


def _values(core, namespace: str, kind: str, name: str, optional: bool) -> dict[str, bytes]:
    """The decoded entries of Secret or ConfigMap `name` ({} if optional and missing)."""
    read = core.read_namespaced_secret if kind == "secret" else core.read_namespaced_config_map
    try:
        obj = json.loads(read(name, namespace, _preload_content=False).data)
    except ApiException as err:
        if err.status == 404 and optional:
            return {}
        if err.status == 404:
            raise ContainerConfigError(f'{kind} "{name}" not found') from None
        raise
    if kind == "secret":
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    values = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
    values.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return values


# --- the environment -------------------------------------------------------------------


def container_env(core, pod: dict, container: dict, base: dict[str, str]) -> dict[str, str]:
    """`base` plus the container's `envFrom` and `env`. `pod` must carry the status
    fields a fieldRef may name (podIP, hostIP) already."""
    namespace = pod["metadata"]["namespace"]
    env = dict(base)
    for source in container.get("envFrom") or []:
        kind = "secret" if "secretRef" in source else "configmap"
        ref = source.get("secretRef") or source["configMapRef"]
        values = _values(core, namespace, kind, ref["name"], bool(ref.get("optional")))
        env.update({source.get("prefix", "") + k: v.decode() for k, v in values.items()})
    for var in container.get("env") or []:
        value = _env_value(core, pod, var)
        if value is not None:
            env[var["name"]] = value
    return env


def _env_value(core, pod: dict, var: dict) -> str | None:
    source = var.get("valueFrom")
    if source is None:
        return var.get("value", "")
    if "fieldRef" in source:
        return _field(pod, source["fieldRef"]["fieldPath"])
    if "secretKeyRef" in source:
        kind, ref = "secret", source["secretKeyRef"]
    elif "configMapKeyRef" in source:
        kind, ref = "configmap", source["configMapKeyRef"]
    else:
        raise ContainerConfigError(f"env {var['name']}: the test kubelet cannot fill {source}")
    optional = bool(ref.get("optional"))
    values = _values(core, pod["metadata"]["namespace"], kind, ref["name"], optional)
    if ref["key"] in values:
        return values[ref["key"]].decode()
    if optional:
        return None
    raise ContainerConfigError(f"couldn't find key {ref['key']} in {kind} {ref['name']}")


def _field(pod: dict, path: str) -> str:
    """A fieldRef: metadata.name, status.podIP, spec.nodeName, metadata.labels['k'], ..."""
    if m := re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path):
        return pod["metadata"].get(m[1], {}).get(m[2], "")
    section, _, name = path.partition(".")
    return str(pod.get(section, {}).get(name, ""))


# --- volumes ---------------------------------------------------------------------------


def volume_mounts(core, pod: dict, container: dict, volumes_dir: Path) -> list[tuple]:
    """(host path, mount path, read only) for each of the container's volumeMounts, outer
    mount paths first (a mount inside another must come after it)."""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
    sources: dict[str, Path] = {}
    mounts = []
    for mount in container.get("volumeMounts") or []:
        name = mount["name"]
        if name not in sources:
            sources[name] = _volume(core, pod, volumes[name], volumes_dir / name)
        source = sources[name]
        if mount.get("subPath"):
            source = source / mount["subPath"]
            source.mkdir(parents=True, exist_ok=True)
        mounts.append((source, mount["mountPath"], bool(mount.get("readOnly"))))
    return sorted(mounts, key=lambda m: len(Path(m[1]).parts))


def _volume(core, pod: dict, volume: dict, directory: Path) -> Path:
    """The host path that holds `volume`'s files (made and filled here if needed)."""
    if "hostPath" in volume:
        path, kind = Path(volume["hostPath"]["path"]), volume["hostPath"].get("type", "")
        if kind == "DirectoryOrCreate":
            path.mkdir(parents=True, exist_ok=True)
        elif kind == "FileOrCreate":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        elif kind and not path.exists():
            raise ContainerConfigError(f"hostPath type check failed: {path} is not a {kind}")
        return path
    directory.mkdir(parents=True, exist_ok=True)
    if "emptyDir" in volume:
        return directory
    if "configMap" in volume or "secret" in volume:
        kind = "secret" if "secret" in volume else "configmap"
        ref = volume.get("secret") or volume["configMap"]
        name, optional = ref.get("secretName") or ref["name"], bool(ref.get("optional"))
        _write_files(
            directory, _values(core, pod["metadata"]["namespace"], kind, name, optional), ref
        )
        return directory
    raise ContainerConfigError(
        f"volume {volume['name']}: the test kubelet supports only {', '.join(VOLUME_KINDS)}"
    )


def _write_files(directory: Path, values: dict[str, bytes], ref: dict) -> None:
    """A configMap or secret volume's files: all keys, or `items` (key -> path)."""
    items = ref.get("items") or [{"key": key, "path": key} for key in values]
    for item in items:
        if item["key"] not in values:
            if ref.get("optional"):
                continue
            raise ContainerConfigError(f"references non-existent key: {item['key']}")
        path = directory / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(values[item["key"]])
        path.chmod(item.get("mode", ref.get("defaultMode", 0o644)))


# --- mount points and the command line -------------------------------------------------


def make_mount_points(mounts: list[tuple]) -> None:
    """Make the mount points missing on the host: directories, or an empty file for a
    file. A mount path inside another of the pod's mounts is left to `sandbox_argv`: it
    belongs in that volume, not on the host."""
    _share_mount_points()
    targets = [Path(target) for _, target, _ in mounts]
    for source, target, _ in mounts:
        target = Path(target)
        if any(other in target.parents for other in targets):
            continue
        for path in [*reversed(target.parents), target]:
            try:
                if path == target and not source.is_dir():
                    path.touch(exist_ok=False)
                else:
                    path.mkdir()
            except FileExistsError:
                continue
            os.write(_fd, f"{path}\n".encode())  # one short append: whole, whoever writes


def _share_mount_points() -> None:
    global _fd
    with _lock:
        if _fd is None:
            _fd = os.open(MOUNT_POINTS, os.O_CREAT | os.O_RDWR | os.O_APPEND, 0o666)
            fcntl.flock(_fd, fcntl.LOCK_SH)  # waits while another process removes them


def remove_mount_points() -> None:
    """Remove the mount points listed (made by any process), if still empty, unless
    another process has pods (see the module's docstring), which will then do it. Call it
    when no pod of this process runs any more."""
    global _fd
    with _lock:
        if _fd is None:
            return
        try:
            fcntl.flock(_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # in use by another process
        else:
            for path in reversed(MOUNT_POINTS.read_text().splitlines()):
                with contextlib.suppress(OSError):  # not empty, or gone already
                    if os.path.isdir(path):
                        os.rmdir(path)
                    elif os.path.getsize(path) == 0:
                        os.unlink(path)
            os.ftruncate(_fd, 0)
        os.close(_fd)  # releases the lock
        _fd = None


def sandbox_argv(mounts: list[tuple], command: list[str], workdir: str | None) -> list[str]:
    """The command line that runs `command` in a private mount namespace after binding
    each volume at its mount path. `exec` keeps the pid: the pid of the returned command
    line is the pid of `command`."""
    steps = []
    for source, target, read_only in mounts:
        q = shlex.quote(target)
        if source.is_dir():
            steps.append(f"mkdir -p {q}")
        else:
            steps.append(f"mkdir -p {shlex.quote(str(Path(target).parent))} && touch {q}")
        steps.append(f"mount --bind {shlex.quote(str(source))} {q}")
        if read_only:
            steps.append(f"mount -o remount,bind,ro {q}")
    if workdir:
        steps.append(f"cd {shlex.quote(workdir)}")
    script = " && ".join([*steps, 'exec "$@"'])
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *command]
