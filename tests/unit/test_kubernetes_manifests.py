"""`--dry-run` of a Kubernetes job: every object it would create, valid for a current
Kubernetes (kubernetes-validate, strict), wired together by labels, owners and names."""

from __future__ import annotations

import json

import pytest
import yaml

import elasticdl_nb as edl
from elasticdl_nb.spec import SpecError
from tests.integration.models import DIGITS, custom_model, digits_split

CURRENT_KUBERNETES = "1.33"


@pytest.fixture(scope="module")
def digits():
    return digits_split()[0]


def dry_run(digits, **options) -> list[dict]:
    text = edl.train(
        custom_model,
        **DIGITS,
        data=digits,
        backend="kubernetes",
        dry_run=True,
        check=False,
        name="digits",
        **options,
    )
    assert text.startswith("# elasticdl-nb --dry-run")
    return list(yaml.safe_load_all(text))


def test_dry_run_objects_pass_strict_validation_and_fit_together(digits, job_home, tmp_path):
    import kubernetes_validate

    template = tmp_path / "pod.yaml"
    template.write_text(
        "metadata: {annotations: {team: ranking}}\n"
        "spec:\n"
        "  nodeSelector: {pool: training}\n"
        "  tolerations: [{key: spot, operator: Exists}]\n"
        "  containers: [{volumeMounts: [{name: data, mountPath: /data}]}]\n"
        "  volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]\n"
    )
    objects = dry_run(
        digits,
        workers=3,
        ps=2,
        namespace="ml",
        env=["MODE=test"],
        shared_volume="pvc:jobs",
        worker_resources="cpu=500m,memory=1Gi",
        pod_template=str(template),
    )
    for obj in objects:
        kubernetes_validate.validate(obj, CURRENT_KUBERNETES, strict=True)
    kinds = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert kinds == [
        ("Job", "digits-master"),
        ("Service", "digits-master"),
        ("ConfigMap", "digits-bundle"),
        ("Secret", "digits-token"),
        ("Pod", "digits-ps-0"),
        ("Service", "digits-ps-0"),
        ("Pod", "digits-ps-1"),
        ("Service", "digits-ps-1"),
        ("Pod", "digits-worker-0"),
        ("Pod", "digits-worker-1"),
        ("Pod", "digits-worker-2"),
    ]
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    assert all(o["metadata"]["namespace"] == "ml" for o in objects)
    # The pod template travels with the job: its master makes the other pods from it,
    # in a pod of its own, where the notebook's path does not exist.
    bundle = by_name[("ConfigMap", "digits-bundle")]["data"]
    assert bundle["pod-template.yaml"] == template.read_text()
    assert json.loads(bundle["spec.json"])["pod_template"] == "/job/digits/pod-template.yaml"
    # Everything belongs to the master's Job: deleting it deletes the job. Not as its
    # controller: the Job controller would count worker pods as its own (or release them).
    assert "ownerReferences" not in objects[0]["metadata"]
    owners = [o["metadata"].get("ownerReferences") for o in objects[1:]]
    assert owners == [
        [{"apiVersion": "batch/v1", "kind": "Job", "name": "digits-master",
          "uid": "<the master Job's uid>"}]
    ] * 10  # fmt: skip
    # The token is never printed, and reaches pods only from the Secret.
    secret = by_name[("Secret", "digits-token")]
    assert secret["stringData"]["token"] == "<generated at launch>"
    worker = by_name[("Pod", "digits-worker-1")]
    container = worker["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["ELASTICDL_NB_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "digits-token"
    assert env["ELASTICDL_NB_PS_ADDRS"]["value"] == (
        "digits-ps-0.ml.svc:50002,digits-ps-1.ml.svc:50002"
    )
    assert env["MODE"]["value"] == "test"
    # The TLS files are in the Secret too (placeholders here), every name's; each pod
    # mounts the authority's certificate and its own name's pair, read-only, no more.
    assert set(secret["stringData"]) == {
        "token", "ca.crt", *(f"{n}.{ext}" for n in
                             ("master", "worker", "notebook", "ps-0", "ps-1")
                             for ext in ("crt", "key"))
    }  # fmt: skip
    master_pod = {**by_name[("Job", "digits-master")]["spec"]["template"], "kind": "Pod"}
    for pod, own in [(master_pod, "master"), (worker, "worker"),
                     (by_name[("Pod", "digits-ps-1")], "ps-1")]:  # fmt: skip
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "tls")
        assert volume["secret"]["secretName"] == "digits-token"
        assert volume["secret"]["defaultMode"] == 0o440
        mounted = {i["key"] for i in volume["secret"]["items"]}
        assert mounted == {"ca.crt", f"{own}.crt", f"{own}.key"}
        main = pod["spec"]["containers"][0]
        mount = next(v for v in main["volumeMounts"] if v["name"] == "tls")
        assert mount["readOnly"] is True
        tls_dir = next(e for e in main["env"] if e["name"] == "ELASTICDL_NB_TLS_DIR")
        assert tls_dir["value"] == mount["mountPath"]
    assert container["command"][-2:] == ["--id", "1"]
    assert container["resources"] == {
        "requests": {"cpu": "500m", "memory": "1Gi"},
        "limits": {"memory": "1Gi"},
    }
    assert worker["spec"]["priorityClassName"] == "elasticdl-nb-low"
    assert by_name[("Pod", "digits-ps-0")]["spec"]["priorityClassName"] == "elasticdl-nb-high"
    assert worker["metadata"]["labels"]["elasticdl-nb/role"] == "worker"
    # The PS Service selects its PS by index and exposes the bulk channel too.
    service = by_name[("Service", "digits-ps-1")]
    assert service["spec"]["selector"]["elasticdl-nb/index"] == "1"
    assert [p["port"] for p in service["spec"]["ports"]] == [50002, 50003]
    # The pod template reached every pod, merged rather than replacing our fields.
    job = by_name[("Job", "digits-master")]
    master = {**job["spec"]["template"], "kind": "Pod"}
    for obj in [*objects, master]:
        if obj["kind"] == "Pod":
            assert obj["spec"]["nodeSelector"] == {"pool": "training"}
            assert obj["metadata"]["annotations"] == {"team": "ranking"}
            mounts = [v["mountPath"] for v in obj["spec"]["containers"][0]["volumeMounts"]]
            assert "/job" in mounts and "/data" in mounts
    # The bundle travels in the ConfigMap and is mounted back at its paths.
    cm = by_name[("ConfigMap", "digits-bundle")]
    module = cm["data"]["bundle__source__captured_model.py"]
    assert "custom_model = _values['custom_model']" in module  # a test module's: pickled
    assert "bundle__source__values.pkl" in cm["binaryData"]
    items = {
        i["path"]
        for v in master["spec"]["volumes"]
        if "configMap" in v
        for i in v["configMap"]["items"]
    }
    assert {"spec.json", "sources.json", "bundle/manifest.json"} <= items
    # The master is ready once its gRPC port (the one its Service targets) accepts.
    probe = master["spec"]["containers"][0]["readinessProbe"]
    master_ports = [p["targetPort"] for p in by_name[("Service", "digits-master")]["spec"]["ports"]]
    assert probe["tcpSocket"]["port"] in master_ports
    # The master's Service selects the pods the Job makes, whatever their names.
    selector = by_name[("Service", "digits-master")]["spec"]["selector"]
    assert selector.items() <= master["metadata"]["labels"].items()
    assert selector["elasticdl-nb/role"] == "master"
    # Nothing was launched, and nothing is left behind.
    assert not list((job_home / "jobs").glob("*"))


def test_the_master_is_the_one_pod_of_a_job_that_restarts_it_in_place(digits, job_home):
    """A master that fails is restarted in its pod (its journal is in the job directory);
    a master pod that goes is replaced by the Job; the Job gives up after as many
    failures as a local job's supervisor restarts its master. Workers and PS stay
    `Never`: the master decides about them."""
    objects = dry_run(digits, shared_volume="hostPath:/srv/jobs", ps=1, workers=1)
    job = objects[0]
    assert job["apiVersion"] == "batch/v1"
    assert job["metadata"]["labels"] == {
        "app.kubernetes.io/name": "elasticdl-nb",
        "elasticdl-nb/job": "digits",
        "elasticdl-nb/role": "master",
    }
    spec = job["spec"]
    assert (spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (1, 1, 20)
    assert "selector" not in spec  # the API server makes one from the Job's uid
    pod = spec["template"]
    assert "name" not in pod["metadata"]  # its pods get generated names
    assert pod["spec"]["restartPolicy"] == "OnFailure"
    assert pod["spec"]["serviceAccountName"] == "elasticdl-nb-master"
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    # It finds its own pod (and so its Job) by the name the downward API gives it.
    assert env["ELASTICDL_NB_POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["ELASTICDL_NB_JOB_DIR"]["value"] == "/job/digits"
    assert {"name": "job", "hostPath": {"path": "/srv/jobs", "type": "DirectoryOrCreate"}} in (
        pod["spec"]["volumes"]
    )
    for obj in objects[1:]:
        if obj["kind"] == "Pod":
            assert obj["spec"]["restartPolicy"] == "Never"


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(dry_run=False), "needs shared_volume="),
        (dict(backend="local"), "add --backend kubernetes"),
        (dict(worker_resources="cpu=lots"), "'lots' is not a Kubernetes quantity for cpu"),
        (dict(pod_template="/no/such.yaml"), "pod_template '/no/such.yaml' does not exist"),
        (dict(shared_volume="nfs:server"), "neither 'pvc:CLAIM' nor 'hostPath"),
        (dict(run_as="alice"), "'alice' is not UID:GID"),
        (dict(run_as="0:0"), "is root"),
    ],
    ids=["launch", "local", "quantity", "template", "volume", "run_as", "root"],
)
def test_bad_kubernetes_options_are_refused_before_anything_is_made(
    digits, job_home, options, message
):
    options = {"backend": "kubernetes", "dry_run": True, **options}
    with pytest.raises(SpecError, match=message):
        edl.train(custom_model, **DIGITS, data=digits, check=False, **options)
    assert not list((job_home / "jobs").glob("*")) if (job_home / "jobs").exists() else True


def _pod_contexts(objects: list[dict]) -> list[dict]:
    pods = [o["spec"]["template"]["spec"] for o in objects if o["kind"] == "Job"]
    pods += [o["spec"] for o in objects if o["kind"] == "Pod"]
    return [p["securityContext"] for p in pods]


def test_a_jobs_pods_run_as_the_image_user_or_as_run_as_says(digits, job_home):
    contexts = _pod_contexts(dry_run(digits, ps=1, shared_volume="pvc:jobs"))
    assert contexts and all(c == {"fsGroup": 1000} for c in contexts)
    contexts = _pod_contexts(dry_run(digits, ps=1, shared_volume="pvc:jobs", run_as="1001:1002"))
    expected = {"runAsUser": 1001, "runAsGroup": 1002, "runAsNonRoot": True, "fsGroup": 1002}
    assert len(contexts) >= 3 and all(c == expected for c in contexts)  # master, PS, workers


def test_from_a_notebook_in_a_pod_the_jobs_pods_run_as_the_notebooks_user(
    digits, job_home, monkeypatch
):
    """JupyterHub and Kubeflow run each user's notebook as a uid of its own: the job's
    pods take it (and its gid), unless run_as= says otherwise; a notebook outside a
    cluster, or one that runs as root, leaves the image's user."""
    monkeypatch.setattr("os.getuid", lambda: 1001)
    monkeypatch.setattr("os.getgid", lambda: 100)
    assert all("runAsUser" not in c for c in _pod_contexts(dry_run(digits, shared_volume="pvc:j")))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    contexts = _pod_contexts(dry_run(digits, shared_volume="pvc:j"))
    assert all(c["runAsUser"] == 1001 and c["fsGroup"] == 100 for c in contexts), contexts
    contexts = _pod_contexts(dry_run(digits, shared_volume="pvc:j", run_as="2000:2000"))
    assert all(c["runAsUser"] == 2000 for c in contexts), contexts


def test_deploy_manifests_are_strictly_valid_and_grant_no_cluster_wide_rights():
    import kubernetes_validate

    from tests.conftest import REPO

    documents = []
    for path in sorted((REPO / "deploy").glob("*.yaml")):
        documents += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    for _, document in documents:
        kubernetes_validate.validate(document, CURRENT_KUBERNETES, strict=True)
    kinds = {(name, d["kind"]) for name, d in documents}
    assert ("rbac.yaml", "ClusterRole") not in kinds  # least privilege: namespaced only
    roles = {d["metadata"]["name"]: d for _, d in documents if d["kind"] == "Role"}
    master_rules = {
        resource: set(rule["verbs"])
        for rule in roles["elasticdl-nb-master"]["rules"]
        for resource in rule["resources"]
    }
    # The master manages pods and services, lists events (a preemption's only trace
    # before 1.26) and reads its Job (on SIGTERM: is the job being deleted, or only this
    # master pod?), holds its job's Lease (one master acts at a time), and nothing else
    # (no secrets, no configmaps, no changes to Jobs).
    assert set(master_rules) == {"pods", "services", "events", "jobs", "leases"}
    assert master_rules["services"] == {"create", "get"}  # the garbage collector deletes
    assert master_rules["events"] == {"list"}
    assert master_rules["jobs"] == {"get"}
    assert master_rules["leases"] == {"get", "create", "update"}  # no list, watch, delete
    assert "*" not in set().union(*master_rules.values())
    user_rules = {
        resource: set(rule["verbs"])
        for rule in roles["elasticdl-nb-user"]["rules"]
        for resource in rule["resources"]
    }
    # The user makes, finds and deletes the master's Job; deleting it deletes the job.
    assert user_rules["jobs"] == {"create", "get", "list", "delete"}
    groups = {
        r["apiGroups"][0] for r in roles["elasticdl-nb-user"]["rules"] if "jobs" in r["resources"]
    }
    assert groups == {"batch"}
    classes = {
        d["metadata"]["name"]: d["value"] for _, d in documents if d["kind"] == "PriorityClass"
    }
    assert classes["elasticdl-nb-low"] < classes["elasticdl-nb-high"]
    # The notebook in the cluster (notebook.yaml) gets the user Role, no rights of its own.
    notebook = [d for name, d in documents if name == "notebook.yaml"]
    assert {d["kind"] for d in notebook} >= {"ServiceAccount", "RoleBinding", "Pod"}
    assert not {d["kind"] for d in notebook} & {"Role", "ClusterRole", "ClusterRoleBinding"}
    (binding,) = [d for d in notebook if d["kind"] == "RoleBinding"]
    assert binding["roleRef"]["name"] == "elasticdl-nb-user"
    (pod,) = [d for d in notebook if d["kind"] == "Pod"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
