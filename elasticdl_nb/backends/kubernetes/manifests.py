"""Every Kubernetes object of a job, as plain dicts, from its JobSpec.

The notebook creates four: the master's Job (a `batch/v1` Job whose one pod is the
master), the master's Service, the model bundle's ConfigMap and the job's Secret (its
token, and its TLS authority's certificate with each name's certificate and key). The
master creates the rest: a pod per worker and PS and a Service per PS (a relaunched PS
keeps its address). Everything is owned by the Job, which outlives any master pod: the
kubelet restarts a master container that dies in its pod, the Job controller makes a new
master pod when one is deleted or evicted, and deleting the Job deletes the whole job.
Labels say job, role and index; `attach` finds jobs by them.

Pure functions: no API calls here, so `--dry-run` prints exactly what would be created.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elasticdl_nb.backends.job_records import MASTER_MODULE
from elasticdl_nb.backends.kubernetes.pod_template import load_template, merge_into_pod
from elasticdl_nb.keras_flavor import environ_for
from elasticdl_nb.runtime.job_dir import JobDir
from elasticdl_nb.runtime.logs import LOG_DIR_ENV
from elasticdl_nb.runtime.process_env import (
    BIND_HOST_ENV,
    BULK_PORT_ENV,
    JOB_DIR_ENV,
    MASTER_ENV,
    PS_ENV,
    TLS_DIR_ENV,
)
from elasticdl_nb.runtime.protocol import tls
from elasticdl_nb.runtime.protocol.auth import TOKEN_ENV
from elasticdl_nb.spec import JobSpec
from elasticdl_nb.spec.kubernetes import parse_env, parse_resources, parse_run_as

APP = "elasticdl-nb"
LABEL_JOB, LABEL_ROLE, LABEL_INDEX = "elasticdl-nb/job", "elasticdl-nb/role", "elasticdl-nb/index"
# A worker above its range's MIN, at the elastic priority class (`-l elasticdl-nb/elastic`).
LABEL_ELASTIC = "elasticdl-nb/elastic"
MASTER_PORT, PS_PORT, PS_BULK_PORT = 50001, 50002, 50003
JOB_MOUNT = "/job"  # the shared volume; the job directory is JOB_MOUNT/<name>
POD_TEMPLATE_FILE = "pod-template.yaml"  # the user's pod_template, in the job directory
JOB_VOLUME = "job"  # its name in a pod's volumes
BUNDLE_MOUNT = "/etc/elasticdl-nb/job"  # the ConfigMap: spec, sources, model bundle
TOKEN_KEY = "token"
# The Secret's TLS files that a pod's own name needs (the authority's certificate, its
# certificate and key): read-only, readable by the runtime's group only.
TLS_MOUNT = "/etc/elasticdl-nb/tls"
TLS_FILE_MODE = 0o440
RUNTIME_GID = 1000  # the runtime image's user and group (deploy/Dockerfile)
# How often the master may fail before its Job gives up (the local supervisor's 20
# restarts); a deleted or evicted master pod is not counted.
MASTER_BACKOFF_LIMIT = 20
POD_NAME_ENV = "ELASTICDL_NB_POD_NAME"  # the master's own pod (downward API): its owner


def labels(name: str, role: str | None = None, index: int | None = None) -> dict[str, str]:
    out = {"app.kubernetes.io/name": APP, LABEL_JOB: name}
    if role is not None:
        out[LABEL_ROLE] = role
    if index is not None:
        out[LABEL_INDEX] = str(index)
    return out


def _meta(spec: JobSpec, name: str, obj_name: str, owner: dict | None = None, **label_args):
    meta: dict[str, Any] = {
        "name": obj_name,
        "namespace": spec.namespace,
        "labels": labels(name, **label_args),
    }
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return meta


def owner_reference(job_name: str, uid: str) -> dict[str, Any]:
    """Makes an object part of the master's Job: the garbage collector deletes it with it.

    Not a controller reference: the Job controller counts the pods it controls as its
    own replicas (and releases those its selector does not match), and the job's worker
    and PS pods are the master's, not the Job's. No `blockOwnerDeletion` either: it would
    take `update` on jobs/finalizers where the OwnerReferencesPermissionEnforcement
    admission plugin runs, and only a foreground deletion waits for it."""
    return {"apiVersion": "batch/v1", "kind": "Job", "name": job_name, "uid": uid}


# ---------------------------------------------------------------- names


def master_name(name: str) -> str:
    """The master's Job and Service (its pods get generated names: `<this>-<5 chars>`)."""
    return f"{name}-master"


def master_selector(name: str) -> str:
    """The label selector of a job's master pods (one at a time, but a replaced one may
    linger while it terminates)."""
    return f"{LABEL_JOB}={name},{LABEL_ROLE}=master"


def pod_name(name: str, role: str, index: int) -> str:
    return f"{name}-{role}-{index}"


def configmap_name(name: str) -> str:
    return f"{name}-bundle"


def secret_name(name: str) -> str:
    return f"{name}-token"


@dataclass(frozen=True)
class Addresses:
    """Where workers and PS reach the master and each PS: their Services, so a
    relaunched PS keeps its address. The master uses the Services' cluster IPs (no
    dependence on cluster DNS); `--dry-run`, before any IP exists, shows the DNS names."""

    master: str
    ps: tuple[str, ...]

    @classmethod
    def service_dns(cls, spec: JobSpec, name: str) -> Addresses:
        def dns(obj_name: str, port: int) -> str:
            return f"{obj_name}.{spec.namespace}.svc:{port}"

        return cls(
            dns(master_name(name), MASTER_PORT),
            tuple(dns(pod_name(name, "ps", i), PS_PORT) for i in range(spec.parameter_servers)),
        )


# ---------------------------------------------------------------- what the notebook creates


def bundle_configmap(spec: JobSpec, name: str, files: dict[str, bytes]) -> dict[str, Any]:
    """The job's files (spec.json, sources.json, bundle/...) by their relative path.
    ConfigMap keys cannot hold '/', so each file is stored under a flat key and the pod's
    volume maps the keys back to paths (`bundle_volume`)."""
    data, binary = {}, {}
    for path, content in sorted(files.items()):
        key = _key(path)
        try:
            data[key] = content.decode("utf-8")
        except UnicodeDecodeError:
            binary[key] = base64.b64encode(content).decode("ascii")
    cm: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(spec, name, configmap_name(name)),
        "data": data,
    }
    if binary:
        cm["binaryData"] = binary
    return cm


def _key(path: str) -> str:
    return path.replace("/", "__")


def bundle_volume(name: str, paths: list[str]) -> dict[str, Any]:
    return {
        "name": "bundle",
        "configMap": {
            "name": configmap_name(name),
            "items": [{"key": _key(p), "path": p} for p in sorted(paths)],
        },
    }


def token_secret(spec: JobSpec, name: str, token: str, tls_files: dict[str, str]) -> dict[str, Any]:
    """The job's Secret: its token, and `tls_files` (tls.issue's, as text: PEM is ASCII),
    of which each pod mounts only its own name's (`_tls_volume`)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(spec, name, secret_name(name)),
        "type": "Opaque",
        "stringData": {TOKEN_KEY: token, **tls_files},
    }


def _tls_volume(name: str, identity: str) -> dict[str, Any]:
    files = tls.files_of(identity)
    return {
        "name": "tls",
        "secret": {
            "secretName": secret_name(name),
            "defaultMode": TLS_FILE_MODE,
            "items": [{"key": f, "path": f} for f in files],
        },
    }


def master_job(spec: JobSpec, name: str, paths: list[str]) -> dict[str, Any]:
    """The master's Job: one pod (`master_pod`) that must end well once. A master
    container that fails (crash, SIGKILL, OOM) is restarted in its pod by the kubelet and
    finds its journal in the job directory; a master pod that is deleted or evicted is
    replaced by the Job controller. The master exits with 0 only once it has recorded the
    job's end, whatever that end is: the Job completes then."""
    pod = master_pod(spec, name, paths)
    template_meta = {k: v for k, v in pod["metadata"].items() if k not in ("name", "namespace")}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta(spec, name, master_name(name), role="master"),
        "spec": {
            "completions": 1,
            "parallelism": 1,
            "backoffLimit": MASTER_BACKOFF_LIMIT,
            "template": {"metadata": template_meta, "spec": pod["spec"]},
        },
    }


def master_pod(spec: JobSpec, name: str, paths: list[str]) -> dict[str, Any]:
    """The master's pod, as its Job's template makes it (the notebook also asks the API
    server to admit it, in a dry run, before it creates anything)."""
    command = ["python", "-m", MASTER_MODULE, "--job-dir", _job_dir(name)]
    command += ["--copy-from", BUNDLE_MOUNT]  # the ConfigMap's files, into the job dir
    own_name = {"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    pod = _pod(
        spec, name, "master", None, command, spec.master_resources, [MASTER_PORT], [own_name]
    )
    # The kubelet restarts a master that fails in place (its Job's pods may not be
    # `Never`); it exits with 0 once the job's end is recorded.
    pod["spec"]["restartPolicy"] = "OnFailure"
    pod["spec"]["serviceAccountName"] = spec.service_account
    # Ready once its gRPC port accepts: until then its Service has no endpoint and
    # clients wait for readiness instead of meeting a refused connection.
    pod["spec"]["containers"][0]["readinessProbe"] = {
        "tcpSocket": {"port": MASTER_PORT},
        "periodSeconds": 2,
        "timeoutSeconds": 2,
    }
    pod["spec"]["volumes"].append(bundle_volume(name, paths))
    pod["spec"]["containers"][0]["volumeMounts"].append(
        {"name": "bundle", "mountPath": BUNDLE_MOUNT, "readOnly": True}
    )
    return merge_into_pod(pod, spec.pod_template)


def master_service(spec: JobSpec, name: str) -> dict[str, Any]:
    return _service(spec, name, master_name(name), {"master": MASTER_PORT}, role="master")


# ---------------------------------------------------------------- what the master creates


def worker_pod(
    spec: JobSpec,
    name: str,
    index: int,
    owner: dict,
    addresses: Addresses,
    memory: str | None = None,
    elastic: bool = False,
) -> dict[str, Any]:
    """`memory` overrides the spec's (a worker relaunched after running out of it);
    an `elastic` worker (above its range's MIN) gets the elastic priority class."""
    command = ["python", "-m", "elasticdl_nb.runtime.worker", "--id", str(index)]
    resources = _with_memory(spec.worker_resources, memory)
    env = _address_env(addresses)
    pod = _pod(spec, name, "worker", index, command, resources, [], env, owner)
    if elastic:
        pod["metadata"]["labels"][LABEL_ELASTIC] = "true"
        pod["spec"].pop("priorityClassName", None)
        if spec.elastic_worker_priority_class:
            pod["spec"]["priorityClassName"] = spec.elastic_worker_priority_class
    return merge_into_pod(pod, spec.pod_template)


def ps_pod(
    spec: JobSpec,
    name: str,
    index: int,
    owner: dict,
    addresses: Addresses,
    memory: str | None = None,
) -> dict[str, Any]:
    command = ["python", "-m", "elasticdl_nb.runtime.ps", "--id", str(index)]
    ports = [PS_PORT, PS_BULK_PORT]
    env = _address_env(addresses) + [{"name": BULK_PORT_ENV, "value": str(PS_BULK_PORT)}]
    resources = _with_memory(spec.ps_resources, memory)
    pod = _pod(spec, name, "ps", index, command, resources, ports, env, owner)
    return merge_into_pod(pod, spec.pod_template)


def _address_env(addresses: Addresses) -> list[dict[str, Any]]:
    return [
        {"name": MASTER_ENV, "value": addresses.master},
        {"name": PS_ENV, "value": ",".join(addresses.ps)},
    ]


def _with_memory(resources: str, memory: str | None) -> str:
    if memory is None:
        return resources
    parsed = parse_resources("resources", resources)
    parsed["memory"] = memory
    return ",".join(f"{k}={v}" for k, v in parsed.items())


def ps_service(spec: JobSpec, name: str, index: int, owner: dict) -> dict[str, Any]:
    # The bulk channel (every training step's PushPull, runtime/protocol/bulk.py) has its
    # own port.
    ports = {"grpc": PS_PORT, "bulk": PS_BULK_PORT}
    return _service(spec, name, pod_name(name, "ps", index), ports, "ps", index, owner)


# ---------------------------------------------------------------- building blocks


def _job_dir(name: str) -> str:
    return f"{JOB_MOUNT}/{name}"


def _pod(
    spec: JobSpec,
    name: str,
    role: str,
    index: int | None,
    command: list[str],
    resources: str,
    ports: list[int],
    role_env: list[dict[str, Any]],
    owner: dict | None = None,
) -> dict[str, Any]:
    requests = parse_resources(f"{role}_resources", resources)
    limits = {"memory": requests["memory"]} if "memory" in requests else {}
    env = [{"name": k, "value": v} for k, v in parse_env(spec.env).items()]
    # The Keras the job runs (keras_version, settled at launch), in every pod of it.
    env += [{"name": k, "value": v} for k, v in environ_for(spec.keras_version).items()]
    env += role_env + [
        {"name": JOB_DIR_ENV, "value": _job_dir(name)},
        {"name": TLS_DIR_ENV, "value": TLS_MOUNT},
        {"name": LOG_DIR_ENV, "value": f"{_job_dir(name)}/logs"},
        {"name": BIND_HOST_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {  # from the Secret: never on a command line or in the pod spec itself
            "name": TOKEN_ENV,
            "valueFrom": {"secretKeyRef": {"name": secret_name(name), "key": TOKEN_KEY}},
        },
    ]
    container: dict[str, Any] = {
        "name": role,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": command,
        "env": env,
        "resources": {"requests": requests, "limits": limits},
        "volumeMounts": [
            {"name": JOB_VOLUME, "mountPath": JOB_MOUNT},
            {"name": "tls", "mountPath": TLS_MOUNT, "readOnly": True},
        ],
    }
    if ports:
        container["ports"] = [{"containerPort": p} for p in ports]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",  # the master decides about relaunches, not the kubelet
        "containers": [container],
        "volumes": [_job_volume(spec), _tls_volume(name, _identity(role, index))],
        "securityContext": _security_context(spec),
    }
    if role != "master":
        pod_spec["automountServiceAccountToken"] = False  # only the master talks to the API
    priority = getattr(spec, f"{role}_priority_class")
    if priority:
        pod_spec["priorityClassName"] = priority
    obj_name = master_name(name) if role == "master" else pod_name(name, role, index)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _meta(spec, name, obj_name, owner, role=role, index=index),
        "spec": pod_spec,
    }


def _security_context(spec: JobSpec) -> dict[str, Any]:
    """Who the pod's processes are: the image's user 1000 (deploy/Dockerfile), or
    `run_as`'s uid and gid (a notebook's own, in a cluster). A shared volume's files, and
    the TLS files (mode 0440), are readable and writable for them through the group."""
    if not spec.run_as:
        return {"fsGroup": RUNTIME_GID}
    uid, gid = parse_run_as(spec.run_as)
    return {"runAsUser": uid, "runAsGroup": gid, "runAsNonRoot": True, "fsGroup": gid}


def _identity(role: str, index: int | None) -> str:
    """The name a pod's certificate answers to."""
    if role == "ps":
        return tls.ps_name(index)
    return tls.MASTER if role == "master" else tls.WORKER


def _job_volume(spec: JobSpec) -> dict[str, Any]:
    kind, _, where = spec.shared_volume.partition(":")
    if kind == "pvc":
        return {"name": JOB_VOLUME, "persistentVolumeClaim": {"claimName": where}}
    if kind == "hostPath":
        return {"name": JOB_VOLUME, "hostPath": {"path": where, "type": "DirectoryOrCreate"}}
    # No shared volume named: a scratch directory per pod. Enough for --dry-run; the
    # launch refuses it, since checkpoints and the journal must outlive a pod.
    return {"name": JOB_VOLUME, "emptyDir": {}}


def _service(
    spec: JobSpec,
    name: str,
    obj_name: str,
    ports: dict[str, int],
    role: str,
    index: int | None = None,
    owner: dict | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(spec, name, obj_name, owner, role=role, index=index),
        "spec": {
            "selector": labels(name, role, index),
            "ports": [{"name": n, "port": p, "targetPort": p} for n, p in ports.items()],
        },
    }


def bundle_files(spec: JobSpec, name: str, job_dir: Path) -> dict[str, bytes]:
    """The files of a job directory prepared in the notebook that travel in the
    ConfigMap: spec, sources, model bundle, staged arrays and the pod template, with
    every path that names the prepared directory (or the notebook's view of a hostPath
    shared volume, or the template) turned into the path the pods see."""
    prepared = JobDir(job_dir)
    json_files = [prepared.spec.name, prepared.sources.name]  # they name paths: moved below
    files = {p: (job_dir / p).read_bytes() for p in json_files}
    for folder in (prepared.bundle, prepared.data):
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                files[str(path.relative_to(job_dir))] = path.read_bytes()
    moves = {str(job_dir): _job_dir(name)}
    if spec.pod_template:  # the master makes worker and PS pods from it, in its own pod
        load_template(spec.pod_template)  # (a missing or bad file: its SpecError)
        files[POD_TEMPLATE_FILE] = Path(spec.pod_template).expanduser().read_bytes()
        moves[spec.pod_template] = f"{_job_dir(name)}/{POD_TEMPLATE_FILE}"
    kind, _, host_dir = spec.shared_volume.partition(":")
    if kind == "hostPath":
        moves[host_dir.rstrip("/")] = JOB_MOUNT
    for path in json_files:
        text = files[path].decode()
        for local, in_pod in moves.items():  # paths are whole JSON strings or start them
            text = text.replace(f'"{local}/', f'"{in_pod}/').replace(f'"{local}"', f'"{in_pod}"')
        files[path] = text.encode()
    return files
