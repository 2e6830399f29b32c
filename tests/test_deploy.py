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
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install -e '.[test]' (kubernetes-validate)")
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


def _no_unknown_fields(schema):
    """The structural schema with unknown fields rejected: the API server would silently prune them."""
    schema = copy.deepcopy(schema)

    def close(node):
        if isinstance(node, dict):
            if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
                node.setdefault("additionalProperties", False)
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)
    close(schema)
    # the root's apiVersion, kind and metadata are implicit in every CRD (metadata: ObjectMeta, checked below)
    schema["properties"].update(apiVersion={"type": "string"}, kind={"type": "string"},
                                metadata={"type": "object"})
    return schema


def _containers(doc):
    """Every container spec in a manifest."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("containers"), list):
                found.extend(node["containers"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    walk(doc)
    return found


def test_every_manifest_is_present():
    kinds = sorted(doc["kind"] for _, doc in _documents())
    assert kinds == ["DaskCluster", "DaskJob", "Deployment", "PersistentVolumeClaim", "Service"]


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
    assert deployment["spec"]["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
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
