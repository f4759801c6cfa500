"""Starting a job from the notebook against a real API server with RBAC on: with exactly
deploy/rbac.yaml's permissions it works; without them, or with the cluster out of reach,
the namespace missing or the bundle too big, the error says why and what to do, and
nothing is left behind."""

from __future__ import annotations

import json
import time

import pytest

from elasticdl_nb.backends.kubernetes.api import KubernetesError, client_for
from elasticdl_nb.backends.kubernetes.submit import submit
from elasticdl_nb.capture import write_bundle
from elasticdl_nb.spec import JobSpec
from tests.integration.models import DIGITS, custom_model
from tests.kubernetes.access import grant_rbac_yaml, remove_priority_classes

pytestmark = [pytest.mark.slow, pytest.mark.kubernetes]


def prepared_job(tmp_path, namespace: str, **options):
    options.setdefault("shared_volume", f"hostPath:{tmp_path}/shared")
    spec = JobSpec.from_options(data=["x"], backend="kubernetes", namespace=namespace, **options)
    job_dir = tmp_path / "job"
    job_dir.mkdir(parents=True)
    (job_dir / "spec.json").write_text(spec.to_json())
    (job_dir / "sources.json").write_text(json.dumps({"train": [], "validation": []}))
    write_bundle(job_dir / "bundle", functions={"custom_model": custom_model, **DIGITS})
    return spec, job_dir


def objects_of(core, namespace) -> list[str]:
    from kubernetes import client

    batch = client.BatchV1Api(core.api_client)
    found = [f"Job {j.metadata.name}" for j in batch.list_namespaced_job(namespace).items]
    found += [
        f"ConfigMap {c.metadata.name}" for c in core.list_namespaced_config_map(namespace).items
    ]
    found += [f"Secret {s.metadata.name}" for s in core.list_namespaced_secret(namespace).items]
    found += [f"Pod {p.metadata.name}" for p in core.list_namespaced_pod(namespace).items]
    found += [f"Service {s.metadata.name}" for s in core.list_namespaced_service(namespace).items]
    return sorted(x for x in found if "job-" in x)


def test_a_user_with_the_rbac_yaml_role_starts_a_job_and_without_it_gets_told_why(
    k8s_cluster, k8s_admin_client, k8s_user_client, k8s_namespace, tmp_path
):
    from kubernetes import client

    core = client.CoreV1Api(k8s_admin_client)
    no_priority = {f"{r}_priority_class": "" for r in ("master", "ps", "worker")}
    spec, job_dir = prepared_job(tmp_path, k8s_namespace, name="job-a", **no_priority)

    with pytest.raises(KubernetesError) as refused:
        submit(spec, "job-a", job_dir, "secret-token", api_client=k8s_user_client)
    message = str(refused.value)
    assert "forbidden" in message and "(HTTP 403)" in message
    assert "deploy/rbac.yaml" in message and "elasticdl-nb-user" in message
    assert objects_of(core, k8s_namespace) == []

    grant_rbac_yaml(k8s_admin_client, k8s_namespace, k8s_cluster.user_name)
    made = submit(spec, "job-a", job_dir, "secret-token", api_client=k8s_user_client)
    master = made["Job"]
    assert master["metadata"]["labels"]["elasticdl-nb/role"] == "master"
    # Everything else belongs to the master's Job: deleting it deletes the job.
    for kind in ("Service", "ConfigMap", "Secret"):
        (owner,) = made[kind]["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"]) == ("Job", master["metadata"]["uid"])
    # (This cluster runs no job controller: the Job makes no master pod here. The pod
    # was only admitted, in a dry run.)
    assert objects_of(core, k8s_namespace) == [
        "ConfigMap job-a-bundle",
        "Job job-a-master",
        "Secret job-a-token",
        "Service job-a-master",
    ]
    secret = core.read_namespaced_secret("job-a-token", k8s_namespace)
    assert secret.data["token"] == "c2VjcmV0LXRva2Vu"  # base64 of secret-token

    # The same name again: the first object already exists, and that is what it says.
    with pytest.raises(KubernetesError, match=r"already exists .*HTTP 409.*another job name"):
        submit(spec, "job-a", job_dir, "t", api_client=k8s_user_client)


def test_a_half_made_job_is_undone(k8s_admin_client, k8s_namespace, tmp_path):
    from kubernetes import client

    core = client.CoreV1Api(k8s_admin_client)
    # The master pod is refused (its service account does not exist) in the dry run that
    # comes first: nothing is made.
    spec, job_dir = prepared_job(tmp_path, k8s_namespace, name="job-b", service_account="nobody")
    with pytest.raises(KubernetesError, match="create Pod job-b-master.*account does not exist"):
        submit(spec, "job-b", job_dir, "t", api_client=k8s_admin_client)
    assert objects_of(core, k8s_namespace) == []

    # The last object is refused (a Secret of that name is there already): the Job made
    # first is deleted again, and the garbage collector takes what it owned.
    spec, job_dir = prepared_job(tmp_path / "2", k8s_namespace, name="job-f",
                                 service_account="default", master_priority_class="")  # fmt: skip
    core.create_namespaced_secret(k8s_namespace, {"metadata": {"name": "job-f-token"}})
    with pytest.raises(KubernetesError, match=r"create Secret job-f-token.*HTTP 409"):
        submit(spec, "job-f", job_dir, "t", api_client=k8s_admin_client)
    deadline = time.monotonic() + 30
    while objects_of(core, k8s_namespace) != ["Secret job-f-token"]:
        assert time.monotonic() < deadline, objects_of(core, k8s_namespace)
        time.sleep(0.2)


def test_missing_namespace_unreachable_server_no_kubeconfig_and_oversize_bundle(
    k8s_cluster, k8s_admin_client, tmp_path, monkeypatch
):
    spec, job_dir = prepared_job(tmp_path, "no-such-namespace", name="job-c")
    with pytest.raises(KubernetesError, match=r"not found \(HTTP 404\).*create it first"):
        submit(spec, "job-c", job_dir, "t", api_client=k8s_admin_client)

    closed = tmp_path / "closed.kubeconfig"
    config = json.loads(k8s_cluster.admin_kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:9"  # nothing listens
    closed.write_text(json.dumps(config))
    with pytest.raises(KubernetesError, match="out of reach.*kubectl cluster-info"):
        submit(spec, "job-c", job_dir, "t", api_client=client_for(str(closed)))

    wrong = tmp_path / "wrong-token.kubeconfig"
    config = json.loads(k8s_cluster.admin_kubeconfig.read_text())
    config["users"][0]["user"]["token"] = "not-a-valid-token"
    wrong.write_text(json.dumps(config))
    with pytest.raises(KubernetesError, match=r"HTTP 401.*credentials were not accepted"):
        submit(spec, "job-c", job_dir, "t", api_client=client_for(str(wrong)))

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubernetesError, match="No kubeconfig at .*none.*set KUBECONFIG"):
        client_for()

    (job_dir / "bundle" / "big.bin").write_bytes(b"\0" * (2 * 2**20))
    with pytest.raises(KubernetesError, match=r"2\.0\d MB, more than a ConfigMap holds"):
        submit(spec, "job-c", job_dir, "t", api_client=k8s_admin_client)


def test_missing_priority_classes_and_a_full_quota_are_explained_not_blamed_on_rbac(
    k8s_admin_client, k8s_namespace, tmp_path
):
    from kubernetes import client

    core = client.CoreV1Api(k8s_admin_client)
    remove_priority_classes(k8s_admin_client)  # other tests of the session made them
    # The default priority classes, which this cluster does not have.
    spec, job_dir = prepared_job(tmp_path, k8s_namespace, name="job-d", service_account="default")
    with pytest.raises(KubernetesError) as refused:
        submit(spec, "job-d", job_dir, "t", api_client=k8s_admin_client)
    message = str(refused.value)
    assert "elasticdl-nb-high" in message and "deploy/priority-classes.yaml" in message
    assert "rbac.yaml" not in message
    assert objects_of(core, k8s_namespace) == []

    core.create_namespaced_resource_quota(
        k8s_namespace, {"metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}}
    )
    no_priority = {f"{r}_priority_class": "" for r in ("master", "ps", "worker")}
    spec, job_dir = prepared_job(
        tmp_path / "2", k8s_namespace, name="job-e", service_account="default", **no_priority
    )
    deadline = time.monotonic() + 30
    while not core.read_namespaced_resource_quota("no-pods", k8s_namespace).status.hard:
        assert time.monotonic() < deadline, "the quota controller never counted the usage"
        time.sleep(0.2)  # until then, admission may not know the quota yet
    while True:  # until the admission plugin sees the quota with its usage
        with pytest.raises(KubernetesError) as refused:
            submit(spec, "job-e", job_dir, "t", api_client=k8s_admin_client)
        if "exceeded quota" in str(refused.value) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    message = str(refused.value)
    assert "exceeded quota" in message and "ResourceQuota has no room" in message
    assert objects_of(core, k8s_namespace) == []
