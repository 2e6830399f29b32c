"""deploy/: Kubernetes objects against the Kubernetes schemas (kubernetes-validate, strict), the operator's
custom resources against the CRD schemas shipped in dask-kubernetes, container commands against the real
CLIs, and the Dockerfile's essentials."""
import copy
import re
import shlex
from importlib import resources
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate",
                                          reason="pip install -e '.[test]' (kubernetes-validate)")
pytest.importorskip("dask_kubernetes", reason="pip install -e '.[test]' (dask-kubernetes ships the operator CRDs)")
import jsonschema  # noqa: E402  (a kubernetes-validate dependency)

from scalemb.cli.main import build_parser  # noqa: E402

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
CRD_FILES = {"DaskCluster": "daskcluster.yaml", "DaskJob": "daskjob.yaml"}
IMAGE = "scalemb:0.1.0"


def _documents():
    return [(path.name, doc) for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]


def _crd_schema(kind: str) -> dict:
    crds = resources.files("dask_kubernetes") / "operator" / "deployment" / "helm" / "dask-kubernetes-operator" / "crds"
    crd = yaml.safe_load((crds / CRD_FILES[kind]).read_text())
    assert crd["spec"]["names"]["kind"] == kind
    (version,) = [v for v in crd["spec"]["versions"] if v["served"]]
    return crd["spec"]["group"] + "/" + version["name"], version["schema"]["openAPIV3Schema"]


def _mappings(node):
    """Every mapping in a YAML/JSON tree, parents first (a parent changed when it is yielded is walked as
    changed)."""
    if isinstance(node, dict):
        yield node
        for value in list(node.values()):
            yield from _mappings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _mappings(value)


def _no_unknown_fields(schema):
    """The structural schema with unknown fields rejected: the API server would silently prune them."""
    schema = copy.deepcopy(schema)
    for node in _mappings(schema):
        if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node.setdefault("additionalProperties", False)
    # the root's apiVersion, kind and metadata are implicit in every CRD (metadata: ObjectMeta, checked below)
    schema["properties"].update(apiVersion={"type": "string"}, kind={"type": "string"},
                                metadata={"type": "object"})
    return schema


def _pod_specs(doc):
    """Every pod spec (a mapping with a ``containers`` list) in a manifest."""
    return [node for node in _mappings(doc) if isinstance(node.get("containers"), list)]


def _containers(doc):
    """Every container spec in a manifest."""
    return [container for spec in _pod_specs(doc) for container in spec["containers"]]


def test_every_manifest_is_present():
    kinds = sorted(doc["kind"] for _, doc in _documents())
    assert kinds == ["DaskCluster", "DaskJob", "Deployment", "NetworkPolicy", "NetworkPolicy",
                     "PersistentVolumeClaim", "Service"]


@pytest.mark.parametrize("name,doc", [d for d in _documents() if d[1]["kind"] not in CRD_FILES],
                         ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_core_objects_match_kubernetes_schema(name, doc):
    version = kubernetes_validate.latest_version()
    kubernetes_validate.validate(doc, version, strict=True)  # raises ValidationError with the path


def test_schema_validation_can_fail():
    bad = yaml.safe_load((DEPLOY / "kubernetes" / "pvc.yaml").read_text())
    bad["spec"]["accessModes"] = "ReadWriteMany"  # must be a list
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, kubernetes_validate.latest_version(), strict=True)
    cluster = next(doc for _, doc in _documents() if doc["kind"] == "DaskCluster")
    api, schema = _crd_schema("DaskCluster")
    broken = copy.deepcopy(cluster)
    broken["spec"]["worker"]["spec"]["containers"][0]["imagePullPolicy"] = 3
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, _no_unknown_fields(schema))
    broken = copy.deepcopy(cluster)
    broken["spec"]["worker"]["replica"] = 2  # misspelt: would be pruned silently
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, _no_unknown_fields(schema))


@pytest.mark.parametrize("kind", sorted(CRD_FILES))
def test_dask_operator_resources_match_the_operator_crds(kind):
    (doc,) = [doc for _, doc in _documents() if doc["kind"] == kind]
    api, schema = _crd_schema(kind)
    assert doc["apiVersion"] == api
    jsonschema.validate(doc, _no_unknown_fields(schema))
    assert doc["metadata"]["name"] and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])


def test_containers_run_the_scalemb_image_with_valid_commands():
    from distributed.cli.dask_scheduler import main as dask_scheduler
    from distributed.cli.dask_worker import main as dask_worker

    parser = build_parser()
    seen = set()
    for name, doc in _documents():
        for container in _containers(doc):
            assert container["image"] == IMAGE, (name, container["name"])
            args = container["args"]
            if args[:2] == ["dask", "scheduler"]:
                dask_scheduler.make_context("dask scheduler", list(args[2:]))
                seen.add("scheduler")
            elif args[:2] == ["dask", "worker"]:
                dask_worker.make_context("dask worker", list(args[2:]))
                seen.add("worker")
            elif args[0] == "scalemb":
                parsed = parser.parse_args(args[1:])
                assert parsed.command == "serve" and parsed.data_root == "/data"
                assert parsed.scheduler == "tcp://scalemb-scheduler:8786"  # the DaskCluster's scheduler Service
                seen.add("serve")
            else:
                assert args[:2] == ["sh", "-c"]
                for step in args[2].split("&&"):
                    words = shlex.split(step)
                    if words[0] == "scalemb":
                        parsed = parser.parse_args(words[1:])
                        seen.add(parsed.command)
                        if parsed.command == "embed":
                            assert parsed.scheduler == "$DASK_SCHEDULER_ADDRESS"
    assert seen == {"scheduler", "worker", "serve", "affinity", "embed"}


def test_volumes_and_service_wiring():
    docs = {doc["kind"]: doc for _, doc in _documents()}
    claim = docs["PersistentVolumeClaim"]["metadata"]["name"]
    assert "ReadWriteMany" in docs["PersistentVolumeClaim"]["spec"]["accessModes"]
    for kind in ("DaskCluster", "DaskJob", "Deployment"):
        text = yaml.safe_dump(docs[kind])
        assert f"claimName: {claim}" in text, kind
    deployment, service = docs["Deployment"], docs["Service"]
    template_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= template_labels.items()
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    cluster = docs["DaskCluster"]
    assert cluster["spec"]["scheduler"]["service"]["selector"]["dask.org/cluster-name"] == cluster["metadata"]["name"]
    job = docs["DaskJob"]
    assert job["spec"]["cluster"]["spec"]["scheduler"]["service"]["selector"]["dask.org/cluster-name"] == \
        job["metadata"]["name"]


def test_dockerfile_is_slim_non_root_and_installs_the_service():
    text = (DEPLOY / "Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert re.fullmatch(r"FROM python:3\.\d+-slim", lines[0])
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    assert any(re.search(r'pip install "\.\[service\]"', line) for line in lines)
    assert not any(line.startswith("ENTRYPOINT") for line in lines)  # Kubernetes args replace CMD
    cmd = next(line for line in lines if line.startswith("CMD "))
    assert build_parser().parse_args(eval(cmd[4:])[1:]).command == "serve"  # noqa: S307 (JSON array literal)
    for copied in re.findall(r"^COPY (.+) \S+$", text, re.M):
        for source in copied.split():
            assert (DEPLOY.parent / source).exists(), source


RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def restricted_violations(pod: dict) -> list:
    """What keeps ``pod`` from the Pod Security Standards "restricted" profile (Kubernetes 1.30 rules)."""
    problems = []
    pod_sc = pod.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            problems.append(key)
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            problems.append(f"volume {volume['name']}: {kinds - RESTRICTED_VOLUMES}")
    for container in pod.get("containers", []) + pod.get("initContainers", []):
        sc, name = container.get("securityContext", {}), container["name"]
        if sc.get("privileged"):
            problems.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation must be false")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []) or set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: capabilities must drop ALL")
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
            problems.append(f"{name}: runAsNonRoot")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            problems.append(f"{name}: runAsUser 0")
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile")
        if any(port.get("hostPort") for port in container.get("ports", [])):
            problems.append(f"{name}: hostPort")
    return problems


def test_every_pod_satisfies_the_restricted_profile_with_resources_and_probes():
    pods = [(name, doc["kind"], pod) for name, doc in _documents() for pod in _pod_specs(doc)]
    assert len(pods) == 6  # service; DaskCluster scheduler + worker; DaskJob job + scheduler + worker
    for name, kind, pod in pods:
        assert restricted_violations(pod) == [], (name, kind)
        for container in pod["containers"]:
            resources_ = container.get("resources", {})
            assert {"cpu", "memory"} <= set(resources_.get("requests", {})), (name, container["name"])
            assert {"cpu", "memory"} <= set(resources_.get("limits", {})), (name, container["name"])
            if container["args"][:2] in (["dask", "worker"], ["dask", "scheduler"]):
                assert "readinessProbe" in container and "livenessProbe" in container, (name, container["name"])
    # the check can fail
    broken = copy.deepcopy(pods[0][2])
    broken["containers"][0]["securityContext"]["capabilities"] = {"drop": ["NET_RAW"]}
    broken["volumes"] = [{"name": "h", "hostPath": {"path": "/"}}]
    assert len(restricted_violations(broken)) == 2


def test_network_policies_admit_only_the_service_and_cluster_pods_to_schedulers():
    docs = [doc for _, doc in _documents()]
    clusters = {doc["metadata"]["name"] for doc in docs if doc["kind"] in CRD_FILES}
    policies = [doc for doc in docs if doc["kind"] == "NetworkPolicy"]
    assert {p["spec"]["podSelector"]["matchLabels"]["dask.org/cluster-name"] for p in policies} == clusters
    for policy in policies:
        assert policy["spec"]["podSelector"]["matchLabels"]["dask.org/component"] == "scheduler"
        (rule,) = policy["spec"]["ingress"]
        assert [port["port"] for port in rule["ports"]] == [8786]
        for source in rule["from"]:
            labels = source["podSelector"]["matchLabels"]
            cluster = policy["spec"]["podSelector"]["matchLabels"]["dask.org/cluster-name"]
            assert (labels.get("app.kubernetes.io/component") == "service"
                    or labels == {"dask.org/cluster-name": cluster})


def test_image_dependencies_are_pinned():
    lines = [line for line in (DEPLOY / "constraints.txt").read_text().splitlines()
             if line and not line.startswith("#")]
    assert lines and all(re.fullmatch(r"[a-z0-9][a-z0-9.-]*==[\w.+-]+", line) for line in lines)
    names = {line.split("==")[0] for line in lines}
    assert {"numpy", "scipy", "dask", "distributed", "zarr", "numba", "fastapi", "uvicorn"} <= names
    assert "-c constraints.txt" in (DEPLOY / "Dockerfile").read_text()
