"""Talking to the API server: a client from the user's kubeconfig (or the pod's service
account), and every refusal turned into one error that says what to do.

The API's own errors are precise but terse ("pods is forbidden: User "alice" cannot
create resource "pods" in API group "" in the namespace "ml""); a notebook user also
needs the fix: which kubeconfig was used, that deploy/rbac.yaml grants exactly this,
that the namespace must exist first.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from elasticdl_nb.errors import ElasticDLError


class KubernetesError(ElasticDLError, RuntimeError):
    """The cluster refused or could not be reached; the message names the cause and fix."""


class KubernetesForbidden(KubernetesError, PermissionError):
    """The API server refused the call for this account (403): a permission it lacks, or
    another user's namespace."""


class ApiServerOutOfReach(KubernetesError):
    """No answer from the API server (refused, timed out): it may answer a retry."""


def in_a_pod() -> bool:
    """Whether this process runs in a Kubernetes pod (the kubelet sets this variable in
    every container): its identity is then its pod's service account."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def client_for(kubeconfig: str = "", timeout: float = 10.0, in_cluster: bool = False):
    """A `kubernetes.client.ApiClient`: from `kubeconfig`, else $KUBECONFIG or
    ~/.kube/config, else (or with `in_cluster`) the service account of the pod we run in."""
    from kubernetes import client, config

    path = kubeconfig or os.environ.get("KUBECONFIG", "") or str(Path.home() / ".kube/config")
    try:
        if in_cluster:
            config.load_incluster_config()
            api = client.ApiClient()
        elif Path(path).expanduser().exists():
            api = config.new_client_from_config(config_file=str(Path(path).expanduser()))
        elif in_a_pod():
            config.load_incluster_config()
            api = client.ApiClient()
        else:
            raise KubernetesError(
                f"No kubeconfig at {path} and not running in a cluster. Fix: pass "
                "kubeconfig='/path/to/kubeconfig' (--kubeconfig), set KUBECONFIG, or run "
                "`kubectl config view` to check that yours works."
            )
    except KubernetesError:
        raise
    except Exception as exc:  # the client's config errors: bad YAML, missing context, ...
        raise KubernetesError(f"Cannot use the kubeconfig {path}: {exc}") from exc
    api.configuration.retries = 1
    api.user_agent = "elasticdl-nb"
    api.timeout = timeout
    return api


def call(
    what: str,
    method,
    *args: Any,
    allow: tuple[int, ...] = (),
    timeout: float = 15.0,
    **kwargs: Any,
) -> dict[str, Any] | None:
    """Run one API call and return its JSON (read raw: older servers' Status replies do
    not parse into the client's models), or None for a refusal whose status is in
    `allow` (404 for "already gone", 409 for "already there"). `what` says what the call
    does, for the error; `timeout` (seconds) bounds it."""
    from kubernetes.client.rest import ApiException

    try:
        response = method(*args, _preload_content=False, _request_timeout=timeout, **kwargs)
    except ApiException as exc:
        if exc.status in allow:
            return None
        refused = KubernetesForbidden if exc.status == 403 else KubernetesError
        raise refused(explain(what, exc)) from None
    except Exception as exc:  # connection refused, TLS, DNS, timeouts: the server is out of reach
        raise ApiServerOutOfReach(
            f"Cannot {what}: the API server is out of reach ({type(exc).__name__}: "
            f"{_short(exc)}). Fix: check that the cluster is up and that the kubeconfig's "
            "server address is reachable from here (`kubectl cluster-info`)."
        ) from None
    return json.loads(response.data or b"{}")


def created(obj: dict[str, Any]) -> float:
    """When the server made `obj` (its creationTimestamp, RFC 3339, to the second) in
    Unix seconds; 0 if it does not say."""
    stamp = (obj.get("metadata") or {}).get("creationTimestamp")
    try:
        return datetime.fromisoformat(stamp).timestamp() if stamp else 0.0
    except ValueError:
        return 0.0


def explain(what: str, exc) -> str:
    """A refusal of the API server as a sentence with its fix."""
    try:
        detail = json.loads(exc.body or "{}").get("message", "")
    except (TypeError, ValueError):
        detail = ""
    detail = detail or exc.reason or ""
    fixes = {
        401: "the kubeconfig's credentials were not accepted (expired token or "
        "certificate?): refresh them, e.g. log in to the cluster again.",
        403: "Your account may not do that there. In a namespace meant for your jobs, a "
        "permission is missing: deploy/rbac.yaml holds exactly what is needed, Role "
        "elasticdl-nb-user for notebook users (an admin applies it and binds it to you) "
        "and Role elasticdl-nb-master for the job's master (service account "
        "elasticdl-nb-master). Another user's namespace, and its jobs, are theirs.",
        404: "it does not exist. If that is the namespace, create it first "
        "(`kubectl create namespace NAME`) or pass namespace= one that exists.",
        409: "an object of that name exists already: pick another job name, or delete the "
        "old job's objects (`%elasticdl stop NAME`).",
        422: "the server found the object invalid.",
    }
    fix = fixes.get(exc.status, "")
    if exc.status == 403:  # admission plugins refuse with 403 too, for other reasons
        fix = _forbidden_fix(detail) or fix
    return f"Cannot {what}: {detail} (HTTP {exc.status}). {fix}".strip()


def _forbidden_fix(detail: str) -> str:
    """The fix for a 403 that is not about RBAC, or '' for one that is."""
    if "PriorityClass" in detail:
        return (
            "the job's priority classes do not exist in this cluster: a cluster admin "
            "applies deploy/priority-classes.yaml, or pass master_priority_class='', "
            "ps_priority_class='', worker_priority_class='' and "
            "elastic_worker_priority_class='' (no priorities)."
        )
    if "exceeded quota" in detail:
        return (
            "the namespace's ResourceQuota has no room for it: request less "
            "(worker_resources=, ps_resources=, master_resources=, fewer workers), or ask "
            "for more quota (`kubectl describe quota`)."
        )
    if "serviceaccount" in detail and "not found" in detail:
        return (
            "the pod's service account does not exist: apply deploy/rbac.yaml in the "
            "namespace, or pass service_account= one that exists."
        )
    return ""


def _short(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text[:200]
