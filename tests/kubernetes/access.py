"""Giving a test namespace what a real cluster admin would: deploy/rbac.yaml (the master's
service account and Role, the notebook user's Role bound to the test cluster's
unprivileged user) and deploy/priority-classes.yaml. Nothing more: the jobs in these
tests run with exactly the permissions the README tells an admin to grant."""

from __future__ import annotations

import yaml

from tests.conftest import REPO


def deploy_documents(name: str) -> list[dict]:
    text = (REPO / "deploy" / name).read_text()
    return [d for d in yaml.safe_load_all(text) if d]


def grant_rbac_yaml(admin, namespace: str, user: str) -> None:
    """Apply deploy/rbac.yaml in the namespace and bind its user Role to `user`."""
    from kubernetes import client, utils

    for document in deploy_documents("rbac.yaml"):
        utils.create_from_dict(admin, document, namespace=namespace)
    client.RbacAuthorizationV1Api(admin).create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "elasticdl-nb-user"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": "elasticdl-nb-user"},
            "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}],
        },
    )  # fmt: skip
    # The API server authorizes from caches of Roles and RoleBindings that follow these
    # writes a moment later (longer on a busy machine): wait until it grants what the
    # user and the master's service account need first, or a job started at once is
    # refused (seen on a fresh-clone run).
    for subject in (user, f"system:serviceaccount:{namespace}:elasticdl-nb-master"):
        wait_until_allowed(admin, namespace, subject, "create", "pods")


def wait_for_account_token(admin, namespace: str, account: str, timeout: float = 30) -> None:
    """Return once the service account `account` has its token secret. Until the
    controller-manager has made it, the ServiceAccount admission plugin (1.20) refuses
    a pod that names the account ('No API token found for service account')."""
    from kubernetes import client

    from tests.integration.faults import wait_for

    core = client.CoreV1Api(admin)
    wait_for(
        lambda: core.read_namespaced_service_account(account, namespace).secrets,
        timeout,
        f"service account {namespace}/{account}'s token",
    )


def wait_until_allowed(
    admin, namespace: str, user: str, verb: str, resource: str, timeout: float = 30
) -> None:
    """Until the API server's authorizer lets `user` `verb` `resource` in `namespace`
    (asked with a SubjectAccessReview, which goes through that same authorizer)."""
    import time

    from kubernetes import client

    groups = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
    review = {
        "spec": {
            "user": user,
            "groups": groups if user.startswith("system:serviceaccount:") else [],
            "resourceAttributes": {"namespace": namespace, "verb": verb, "resource": resource},
        }
    }
    api = client.AuthorizationV1Api(admin)
    deadline = time.monotonic() + timeout
    while not api.create_subject_access_review(review).status.allowed:
        if time.monotonic() > deadline:
            raise AssertionError(f"{user} may still not {verb} {resource} after {timeout:g} s")
        time.sleep(0.05)


def ensure_priority_classes(admin) -> None:
    """deploy/priority-classes.yaml, once per cluster (they are cluster-wide)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    api = client.SchedulingV1Api(admin)
    for document in deploy_documents("priority-classes.yaml"):
        try:
            api.create_priority_class(document)
        except ApiException as exc:
            if exc.status != 409:
                raise


def remove_priority_classes(admin) -> None:
    """Undo `ensure_priority_classes` (running pods keep their priority)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    api = client.SchedulingV1Api(admin)
    for document in deploy_documents("priority-classes.yaml"):
        try:
            api.delete_priority_class(document["metadata"]["name"], _preload_content=False)
        except ApiException as exc:
            if exc.status != 404:
                raise
