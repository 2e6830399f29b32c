"""deploy/: every kustomize overlay rendered by the real kustomize (``kubectl kustomize``), each object validated
(core objects against the Kubernetes schemas with kubernetes-validate, strict; the operator's custom resources
against the CRD schemas shipped in dask-kubernetes, unknown fields refused), the pods the operator would make
from them (its own builder functions) checked against Pod Security "restricted", the NetworkPolicies evaluated
for who reaches which port, the Dask TLS overlay and the scheduler's HTTP API run for real on loopback, the
container commands parsed by the real CLIs, the ServiceMonitor's scrape (port, path, token) served by a real
``scalemb serve``, and deploy/constraints.txt against the image's dependency closure."""
import copy
import functools
import importlib.util
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate",
                                          reason="pip install -e '.[test]' (kubernetes-validate)")
pytest.importorskip("dask_kubernetes", reason="pip install -e '.[test]' (dask-kubernetes ships the operator CRDs)")
import jsonschema  # noqa: E402  (a kubernetes-validate dependency)

from scalemb.cli.main import build_parser  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
KUBE = DEPLOY / "kubernetes"
CRD_FILES = {"DaskCluster": "daskcluster.yaml", "DaskJob": "daskjob.yaml", "DaskAutoscaler": "daskautoscaler.yaml"}
PLACEHOLDER = "scalemb"  # the image name in base/ and jobs/: each environment's params set the real one
# overlay -> (namespace, image, Dask TLS)
OVERLAYS = {"dev": ("scalemb-dev", "scalemb:0.1.0", False), "dev/embed-grqc": ("scalemb-dev", "scalemb:0.1.0", False),
            "prod": ("scalemb", "registry.example.com/scalemb:0.1.0", True),
            "prod/embed-grqc": ("scalemb", "registry.example.com/scalemb:0.1.0", True)}
STACK_KINDS = ["ConfigMap", "DaskAutoscaler", "DaskCluster", "Deployment", "Namespace", "NetworkPolicy",
               "NetworkPolicy", "NetworkPolicy", "NetworkPolicy", "PersistentVolumeClaim", "PodDisruptionBudget",
               "Service", "ServiceAccount"]
JOB_KINDS = ["ConfigMap", "DaskJob", "NetworkPolicy", "NetworkPolicy"]
REPLICATED = {"prod"}  # overlays with two service replicas on PostgreSQL (components/replicas): one more budget
MONITORED = {"prod"}  # overlays with Prometheus scraping (components/monitoring): a ServiceMonitor
SERVICE_MONITOR_CRD = Path(__file__).resolve().parent / "crds" / "monitoring.coreos.com_servicemonitors.yaml"
OPERATOR_NAMESPACE = "dask-operator"  # where the operator's Helm chart is installed (kubernetes.dask.org)


# --------------------------------------------------------------------------------------------------- rendering
def _kustomize_command() -> list:
    """``kubectl kustomize`` (kustomize built into kubectl), else the standalone ``kustomize build``."""
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    pytest.skip("neither kubectl (>= 1.21, kustomize v4+) nor kustomize is on PATH: the overlays cannot be rendered "
                "(this machine kind ships kubectl; Debian's kubernetes-client 1.20 is too old for components)")


@functools.lru_cache(maxsize=None)
def _render(directory: str) -> tuple:
    """The objects ``kustomize`` renders from ``directory`` (relative to deploy/kubernetes/overlays)."""
    result = subprocess.run(_kustomize_command() + [str(KUBE / "overlays" / directory)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, f"kustomize {directory}: {result.stderr.strip()}"
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def _docs(overlay):
    return copy.deepcopy(list(_render(overlay)))


def _all_docs():
    return [(overlay, doc) for overlay in OVERLAYS for doc in _docs(overlay)]


@functools.lru_cache(maxsize=None)
def _crd(kind: str) -> dict:
    """The CRD of ``kind``: the Dask operator's (shipped in dask-kubernetes) or the prometheus-operator's
    ServiceMonitor (tests/crds) (read once: thousands of lines; do not modify)."""
    crds = resources.files("dask_kubernetes") / "operator" / "deployment" / "helm" / "dask-kubernetes-operator" / "crds"
    source = SERVICE_MONITOR_CRD if kind == "ServiceMonitor" else crds / CRD_FILES[kind]
    crd = yaml.load(source.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    assert crd["spec"]["names"]["kind"] == kind
    return crd


def _crd_schema(kind: str):
    crd = _crd(kind)
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


@functools.lru_cache(maxsize=None)
def _crd_validator(kind: str):
    """A validator of ``kind``'s CRD schema with unknown fields rejected (built once: the schemas are large)."""
    schema = _no_unknown_fields(_crd_schema(kind)[1])
    return jsonschema.validators.validator_for(schema)(schema)


def _pod_specs(doc):
    """Every pod spec (a mapping with a ``containers`` list) in a manifest."""
    return [node for node in _mappings(doc) if isinstance(node.get("containers"), list)]


def _containers(doc):
    return [container for spec in _pod_specs(doc) for container in spec["containers"]]


def test_every_overlay_is_tested_and_renders():
    found = sorted(str(path.parent.relative_to(KUBE / "overlays")) for path in (KUBE / "overlays").rglob("*.yaml")
                   if path.name == "kustomization.yaml" and yaml.safe_load(path.read_text())["kind"] == "Kustomization")
    assert found == sorted(OVERLAYS)
    for overlay in OVERLAYS:
        kinds = sorted(doc["kind"] for doc in _docs(overlay))
        expected = STACK_KINDS if "/" not in overlay else JOB_KINDS
        if not OVERLAYS[overlay][2]:
            expected = [kind for kind in expected if kind != "ConfigMap"]  # the TLS settings
        if overlay in REPLICATED:
            expected = sorted(expected + ["PodDisruptionBudget"])  # the service's
        if overlay in MONITORED:
            expected = sorted(expected + ["ServiceMonitor"])
        assert kinds == expected, overlay


def test_replicated_overlays_share_a_postgresql_database_and_single_ones_stay_on_sqlite():
    """Two replicas only where the job database is PostgreSQL (from the Secret), updated one at a time and kept
    one at a time through drains; elsewhere one replica on SQLite, replaced (Recreate), never two writers."""
    for overlay in ("dev", "prod"):
        stack = _docs(overlay)
        deployment = next(doc for doc in stack if doc["kind"] == "Deployment")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e for e in container.get("env", [])}
        budgets = [doc for doc in stack if doc["kind"] == "PodDisruptionBudget"
                   and doc["spec"]["selector"]["matchLabels"].get("app.kubernetes.io/component") == "service"]
        if overlay in REPLICATED:
            assert deployment["spec"]["replicas"] == 2
            assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                                      "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
            assert env["SCALEMB_DATABASE"]["valueFrom"]["secretKeyRef"] == {"name": "scalemb-database", "key": "url"}
            assert "--database" not in container["args"]  # the URL (with its password) only in the Secret
            (budget,) = budgets
            assert budget["spec"]["maxUnavailable"] == 1
            assert budget["metadata"]["namespace"] == OVERLAYS[overlay][0]
            labels = deployment["spec"]["template"]["metadata"]["labels"]
            assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
        else:
            assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
            assert "SCALEMB_DATABASE" not in env and budgets == []
    parser = build_parser()  # the variable is one the service reads
    assert parser.parse_args(["serve", "--data-root", "/d"]).database is None


OBJECT_STORAGE = {"prod"}  # overlays keeping data and results in S3-compatible storage (components/object-storage)


def test_object_storage_overlays_take_the_prefix_and_credentials_from_a_secret():
    """Where the service keeps data and results in object storage, the prefix, the credentials and the endpoint
    come from the Secret scalemb-s3 as the variables the service (``SCALEMB_STORAGE``) and botocore
    (``AWS_*``) read -- never in the arguments -- and the object cache is on the writable /tmp."""
    for overlay in ("dev", "prod"):
        deployment = next(doc for doc in _docs(overlay) if doc["kind"] == "Deployment")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e for e in container.get("env", [])}
        if overlay not in OBJECT_STORAGE:
            assert not {"SCALEMB_STORAGE", "AWS_ACCESS_KEY_ID"} & set(env)
            continue
        keys = {"SCALEMB_STORAGE": "storage", "AWS_ACCESS_KEY_ID": "access-key-id",
                "AWS_SECRET_ACCESS_KEY": "secret-access-key", "AWS_ENDPOINT_URL": "endpoint"}
        for name, key in keys.items():
            assert env[name]["valueFrom"]["secretKeyRef"]["name"] == "scalemb-s3"
            assert env[name]["valueFrom"]["secretKeyRef"]["key"] == key
        assert env["AWS_ENDPOINT_URL"]["valueFrom"]["secretKeyRef"]["optional"] is True  # AWS itself: none
        assert env["SCALEMB_CACHE_DIR"]["value"].startswith("/tmp/")
        assert "SCALEMB_DATABASE" in env  # the replicas component's variable is kept
        assert "--storage" not in container["args"]
    parser = build_parser()
    assert parser.parse_args(["serve", "--data-root", "/d"]).storage is None  # the variable is read instead
    assert parser.parse_args(["serve", "--data-root", "/d", "--storage", "s3://b/p"]).storage == "s3://b/p"


def test_kustomize_errors_are_reported(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources: [missing.yaml]\n")
    result = subprocess.run(_kustomize_command() + [str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "missing.yaml" in result.stderr


# ------------------------------------------------------------------------------------------------ parameters
def test_namespace_image_and_resources_are_overlay_parameters():
    for overlay, (namespace, image, _) in OVERLAYS.items():
        for doc in _docs(overlay):
            if doc["kind"] == "Namespace":
                assert doc["metadata"]["name"] == namespace
                assert doc["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
            else:
                assert doc["metadata"]["namespace"] == namespace, (overlay, doc["kind"], doc["metadata"]["name"])
            for container in _containers(doc):
                assert container["image"] == image, (overlay, doc["kind"], container["name"])
    # the image is named in one place per environment: base/ and jobs/ carry only the placeholder
    for path in list((KUBE / "base").glob("*.yaml")) + list((KUBE / "jobs").rglob("*.yaml")):
        images = re.findall(r"^\s*image:\s*(\S+)", path.read_text(), re.M)
        assert set(images) <= {PLACEHOLDER}, path
    for env in ("dev", "prod"):
        text = "\n".join(p.read_text() for p in (KUBE / "overlays" / env).rglob("*.yaml"))
        assert text.count("newName:") == 1 and text.count("newTag:") == 1, env

    def requests(overlay, kind):
        doc = next(doc for doc in _docs(overlay) if doc["kind"] == kind)
        return [c["resources"]["requests"] for c in _containers(doc)]
    for kind in ("DaskCluster", "Deployment"):
        assert requests("dev", kind) != requests("prod", kind), kind
    assert requests("dev/embed-grqc", "DaskJob") != requests("prod/embed-grqc", "DaskJob")


# ---------------------------------------------------------------------------------------------------- schemas
@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_core_objects_match_kubernetes_schema(overlay):
    version = kubernetes_validate.latest_version()
    for doc in _docs(overlay):
        if doc["kind"] in CRD_FILES:
            # the pod specs inside a custom resource become real pods: validate them as such
            for spec in _pod_specs(doc):
                pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}
                kubernetes_validate.validate(pod, version, strict=True)
        elif doc["kind"] != "ServiceMonitor":  # a custom resource: against its CRD below
            kubernetes_validate.validate(doc, version, strict=True)  # raises ValidationError with the path


@pytest.mark.slow
@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_dask_operator_resources_match_the_operator_crds(overlay):
    custom = [doc for doc in _docs(overlay) if doc["kind"] in CRD_FILES]
    assert custom
    for doc in custom:
        assert _crd(doc["kind"])["spec"]["scope"] == "Namespaced"
        assert doc["apiVersion"] == _crd_schema(doc["kind"])[0]
        _crd_validator(doc["kind"]).validate(doc)
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])


def test_schema_validation_can_fail():
    docs = _docs("dev")
    bad = next(doc for doc in docs if doc["kind"] == "PersistentVolumeClaim")
    bad["spec"]["accessModes"] = "ReadWriteMany"  # must be a list
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, kubernetes_validate.latest_version(), strict=True)
    cluster = next(doc for doc in docs if doc["kind"] == "DaskCluster")
    broken = copy.deepcopy(cluster)
    broken["spec"]["worker"]["spec"]["containers"][0]["imagePullPolicy"] = 3
    with pytest.raises(jsonschema.ValidationError):
        _crd_validator("DaskCluster").validate(broken)
    broken = copy.deepcopy(cluster)
    broken["spec"]["worker"]["replica"] = 2  # misspelt: would be pruned silently
    with pytest.raises(jsonschema.ValidationError):
        _crd_validator("DaskCluster").validate(broken)
    autoscaler = next(doc for doc in docs if doc["kind"] == "DaskAutoscaler")
    del autoscaler["spec"]["maximum"]
    with pytest.raises(jsonschema.ValidationError):
        _crd_validator("DaskAutoscaler").validate(autoscaler)


def test_service_monitor_matches_the_prometheus_operator_crd():
    """Where components/monitoring is enabled, one ServiceMonitor in the stack's namespace, valid against the
    prometheus-operator's CRD (monitoring.coreos.com/v1, unknown fields refused); elsewhere none (it is optional:
    applying it needs the CRD in the cluster)."""
    crd = _crd("ServiceMonitor")
    assert crd["spec"]["scope"] == "Namespaced"
    for overlay, (namespace, _, _) in OVERLAYS.items():
        monitors = [doc for doc in _docs(overlay) if doc["kind"] == "ServiceMonitor"]
        if overlay not in MONITORED:
            assert monitors == [], overlay
            continue
        (monitor,) = monitors
        assert monitor["apiVersion"] == _crd_schema("ServiceMonitor")[0] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["namespace"] == namespace
        _crd_validator("ServiceMonitor").validate(monitor)
    # the validation can fail: a misspelt field, a port given as a number (the schema wants the port's name),
    # an authorization without its Secret's key
    (monitor,) = [doc for doc in _docs("prod") if doc["kind"] == "ServiceMonitor"]
    for path, value in ((("spec", "endpoints", 0, "bearerTokenSecrets"), {"name": "x", "key": "y"}),
                        (("spec", "endpoints", 0, "port"), 8000),
                        (("spec", "endpoints", 0, "authorization", "credentials"), {"name": "scalemb-token"})):
        broken = copy.deepcopy(monitor)
        node = broken
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        with pytest.raises(jsonschema.ValidationError):
            _crd_validator("ServiceMonitor").validate(broken)


# ------------------------------------------------------------------------- the pods the operator makes of them
@functools.lru_cache(maxsize=None)
def _operator():
    from dask_kubernetes.operator.controller import controller
    return controller


def _operator_pods(overlay):
    """``[(role, cluster, pod)]``: every pod the stack or job of ``overlay`` runs, as real pods: the Deployment's
    template, and the scheduler, worker and job-runner pods the operator builds from the custom resources with
    its own builder functions (labels, injected environment)."""
    op = _operator()
    pods = []
    for doc in _docs(overlay):
        namespace, labels = doc["metadata"].get("namespace"), doc["metadata"].get("labels", {})
        if doc["kind"] == "Deployment":
            template = doc["spec"]["template"]
            pods.append(("service", None, {"metadata": {**template["metadata"], "namespace": namespace},
                                           "spec": template["spec"]}))
            continue
        if doc["kind"] == "DaskCluster":
            name, cluster_spec = doc["metadata"]["name"], doc["spec"]
        elif doc["kind"] == "DaskJob":
            name, cluster_spec = doc["metadata"]["name"], doc["spec"]["cluster"]["spec"]
            runner = op.build_job_pod_spec(name, name, namespace, doc["spec"]["job"]["spec"], {}, labels)
            pods.append(("job-runner", name, {**runner, "metadata": {**runner["metadata"], "namespace": namespace}}))
        else:
            continue
        scheduler = op.build_scheduler_deployment_spec(name, cluster_spec["scheduler"]["spec"], {}, labels)
        worker = op.build_worker_deployment_spec(f"{name}-default", namespace, name, "abc12",
                                                 cluster_spec["worker"]["spec"], {}, labels)
        for role, deployment in (("scheduler", scheduler), ("worker", worker)):
            template = deployment["spec"]["template"]
            pods.append((role, name, {"metadata": {**template["metadata"], "namespace": namespace},
                                      "spec": template["spec"]}))
    return pods


RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def restricted_violations(pod: dict) -> list:
    """What keeps pod spec ``pod`` from the Pod Security Standards "restricted" profile (Kubernetes 1.30 rules)
    plus this project's hardening: a read-only root file system and no service-account token."""
    problems = []
    pod_sc = pod.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            problems.append(key)
    if pod.get("automountServiceAccountToken") is not False:
        problems.append("automountServiceAccountToken must be false")
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
        if sc.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{name}: readOnlyRootFilesystem must be true")
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


def _writable_paths(container) -> list:
    """Where a container writes: the image's cache/config/temp directories (Dockerfile ENV) and a Dask worker's
    ``--local-directory`` (spill)."""
    env = dict(re.findall(r"(\w+)=(\S+)", (DEPLOY / "Dockerfile").read_text().split("ENV", 1)[1].split("\n\n")[0]))
    paths = [env[key] for key in ("NUMBA_CACHE_DIR", "MPLCONFIGDIR", "TMPDIR")]
    args = container["args"]
    if "--local-directory" in args:
        paths.append(args[args.index("--local-directory") + 1])
    return paths


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_every_pod_is_restricted_read_only_tokenless_with_resources_and_probes(overlay):
    pods = _operator_pods(overlay)
    roles = sorted(role for role, _, _ in pods)
    assert roles == (["scheduler", "service", "worker"] if "/" not in overlay
                     else ["job-runner", "scheduler", "worker"])
    accounts = {doc["metadata"]["name"] for doc in _docs(overlay.split("/")[0]) if doc["kind"] == "ServiceAccount"}
    assert accounts == {"scalemb"}
    for role, _, pod in pods:
        spec = pod["spec"]
        assert restricted_violations(spec) == [], (overlay, role)
        assert spec["serviceAccountName"] in accounts
        mounts_of = {v["name"]: v for v in spec["volumes"]}
        for container in spec["containers"]:
            where = (overlay, role, container["name"])
            res = container.get("resources", {})
            assert {"cpu", "memory"} <= set(res.get("requests", {})) and {"cpu", "memory"} <= set(res.get("limits", {}))
            # every place it writes is a mounted emptyDir or the volume (the root file system is read-only)
            writable = [m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")
                        and {"emptyDir", "persistentVolumeClaim"} & set(mounts_of[m["name"]])]
            for path in _writable_paths(container):
                assert any(path == w or path.startswith(w.rstrip("/") + "/") for w in writable), (where, path)
            if role == "job-runner":
                continue  # runs to completion and serves nothing: its exit status is its health
            named = {port["name"]: port["containerPort"] for port in container["ports"]}
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert container[probe]["httpGet"]["path"] == "/health", (where, probe)
                assert container[probe]["httpGet"]["port"] in named, (where, probe)
    # the check can fail
    broken = copy.deepcopy(pods[0][2]["spec"])
    broken["containers"][0]["securityContext"]["capabilities"] = {"drop": ["NET_RAW"]}
    broken["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = False
    broken["volumes"] = [{"name": "h", "hostPath": {"path": "/"}}]
    del broken["automountServiceAccountToken"]
    assert len(restricted_violations(broken)) == 4


def test_no_pod_needs_the_kubernetes_api():
    """No Role/RoleBinding ships: no scalemb pod talks to the API server (the operator scales the workers)."""
    for overlay, doc in _all_docs():
        assert doc["kind"] not in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"), overlay
        if doc["kind"] == "ServiceAccount":
            assert doc["automountServiceAccountToken"] is False
    for path in (ROOT / "scalemb").rglob("*.py"):
        assert not re.search(r"^\s*(import|from) (kubernetes|kr8s|dask_kubernetes)\b", path.read_text(), re.M), path


def test_disruption_budget_and_autoscaler_select_the_operators_workers():
    for overlay in ("dev", "prod"):
        docs = _docs(overlay)
        cluster = next(doc for doc in docs if doc["kind"] == "DaskCluster")
        autoscaler = next(doc for doc in docs if doc["kind"] == "DaskAutoscaler")
        assert autoscaler["spec"]["cluster"] == cluster["metadata"]["name"]
        assert 1 <= autoscaler["spec"]["minimum"] <= cluster["spec"]["worker"]["replicas"] <= \
            autoscaler["spec"]["maximum"]
        (pdb,) = [doc for doc in docs if doc["kind"] == "PodDisruptionBudget" and doc["metadata"]["name"] ==
                  "scalemb-workers"]
        assert pdb["spec"]["maxUnavailable"] == 1
        selected = [role for role, _, pod in _operator_pods(overlay)
                    if _selects(pdb["spec"]["selector"], pod["metadata"]["labels"])]
        assert selected == ["worker"]
    dev, prod = (next(d for d in _docs(o) if d["kind"] == "DaskAutoscaler")["spec"] for o in ("dev", "prod"))
    assert dev["maximum"] < prod["maximum"]


# ------------------------------------------------------------------------------------------- network policies
def _selects(selector: dict, labels: dict) -> bool:
    """Kubernetes label-selector semantics (matchLabels and matchExpressions; ``{}`` selects everything)."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        ok = {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[operator]
        if not ok:
            return False
    return True


def admits(policies, source: dict, target: dict, port: int, namespaces: dict) -> bool:
    """Whether NetworkPolicy ``policies`` let pod ``source`` open a TCP connection to ``port`` of pod ``target``
    (pods as ``{"metadata": {namespace, labels}, "spec": ...}``; ``namespaces`` maps a name to its labels).

    Kubernetes semantics for ingress: a pod selected by no Ingress policy of its namespace admits everything;
    otherwise a connection is admitted when some selecting policy has a rule whose ``from`` peers match the
    source (no ``from``: every source; a peer with podSelector only: pods of the policy's namespace; with
    namespaceSelector: pods of the matching namespaces, further narrowed by a podSelector beside it) and whose
    ``ports`` match (none: every port; a named port resolves on the target's containers)."""
    target_ns, labels = target["metadata"]["namespace"], target["metadata"].get("labels", {})
    selecting = [p for p in policies if p["metadata"]["namespace"] == target_ns
                 and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
                 and _selects(p["spec"]["podSelector"], labels)]
    if not selecting:
        return True
    named = {p["name"]: p["containerPort"] for c in target["spec"]["containers"] for p in c.get("ports", [])}
    source_ns, source_labels = source["metadata"]["namespace"], source["metadata"].get("labels", {})

    def peer_matches(peer, policy_ns):
        assert "ipBlock" not in peer  # not used here
        if "namespaceSelector" in peer:
            if not _selects(peer["namespaceSelector"], namespaces[source_ns]):
                return False
        elif source_ns != policy_ns:
            return False
        return _selects(peer.get("podSelector", {}), source_labels)

    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            if "from" in rule and not any(peer_matches(peer, target_ns) for peer in rule["from"]):
                continue
            ports = rule.get("ports")
            if ports is None or any(p.get("protocol", "TCP") == "TCP" and named.get(p["port"], p["port"]) == port
                                    for p in ports):
                return True
    return False


def _pod(namespace, labels, ports=()):
    return {"metadata": {"namespace": namespace, "labels": labels},
            "spec": {"containers": [{"name": "c", "ports": [{"name": f"p{p}", "containerPort": p} for p in ports]}]}}


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_network_policies_admit_only_the_service_and_the_clusters_own_pods(env):
    """M6: a worker's comm and nanny ports, like the scheduler's, run pickled calls: only the service and the
    cluster's own pods reach them.  Evaluated over the real rendered policies and the operator's pods."""
    stack, job = _docs(env), _docs(f"{env}/embed-grqc")
    policies = [doc for doc in stack + job if doc["kind"] == "NetworkPolicy"]
    namespace = OVERLAYS[env][0]
    namespaces = {namespace: {"kubernetes.io/metadata.name": namespace},
                  OPERATOR_NAMESPACE: {"kubernetes.io/metadata.name": OPERATOR_NAMESPACE},
                  "elsewhere": {"kubernetes.io/metadata.name": "elsewhere"}}
    pods = _operator_pods(env) + _operator_pods(f"{env}/embed-grqc")
    by = {(role, cluster): pod for role, cluster, pod in pods}
    service = by["service", None]
    scheduler, worker = by["scheduler", "scalemb"], by["worker", "scalemb"]
    job_scheduler, job_worker = by["scheduler", "scalemb-embed-grqc"], by["worker", "scalemb-embed-grqc"]
    runner = by["job-runner", "scalemb-embed-grqc"]
    stranger = _pod(namespace, {"app": "other"})
    outsider = _pod("elsewhere", {"app.kubernetes.io/name": "scalemb", "app.kubernetes.io/component": "service"})
    operator = _pod(OPERATOR_NAMESPACE, {"app.kubernetes.io/name": "dask-kubernetes-operator"})
    fake_operator = _pod(namespace, {"app.kubernetes.io/name": "dask-kubernetes-operator"})
    comm = {"scheduler": [8786], "worker": [8789, 8790]}
    for target, cluster, own, ports in ((scheduler, "scalemb", [worker, scheduler], comm["scheduler"] + [8787]),
                                        (worker, "scalemb", [worker, scheduler], comm["worker"] + [8788]),
                                        (job_scheduler, "scalemb-embed-grqc", [job_worker, runner],
                                         comm["scheduler"] + [8787]),
                                        (job_worker, "scalemb-embed-grqc", [job_scheduler, runner],
                                         comm["worker"] + [8788])):
        allowed = own + ([service] if cluster == "scalemb" else [])
        for source in allowed:
            assert all(admits(policies, source, target, port, namespaces) for port in ports), cluster
        others = [stranger, outsider, fake_operator] + ([service] if cluster != "scalemb" else []) + \
            ([job_worker, runner] if cluster == "scalemb" else [worker])
        for source in others:
            assert not any(admits(policies, source, target, port, namespaces) for port in ports), \
                (cluster, source["metadata"]["labels"])
        # the operator reaches a scheduler's HTTP API (adaptive target, retiring workers), no comm port
        is_scheduler = target is scheduler or target is job_scheduler
        assert admits(policies, operator, target, 8787, namespaces) is is_scheduler
        assert not any(admits(policies, operator, target, port, namespaces)
                       for port in comm["scheduler"] + comm["worker"])
    # the service's HTTP port is open (bearer token), nothing else of it
    assert admits(policies, stranger, service, 8000, namespaces)
    assert not admits(policies, stranger, service, 8786, namespaces)
    # the evaluator can say no and yes: without the policies everything is admitted
    assert admits([], stranger, worker, 8789, namespaces)


def test_worker_comm_ports_are_fixed_where_the_policy_names_them():
    for overlay in OVERLAYS:
        for role, _, pod in _operator_pods(overlay):
            if role != "worker":
                continue
            (container,) = pod["spec"]["containers"]
            args = container["args"]
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            assert int(args[args.index("--worker-port") + 1]) == ports["tcp-worker"] == 8789
            assert int(args[args.index("--nanny-port") + 1]) == ports["tcp-nanny"] == 8790
            assert args[args.index("--dashboard-address") + 1] == f":{ports['http-dashboard']}"


# ------------------------------------------------------------------------------------------------- commands
def test_containers_run_valid_commands():
    from distributed.cli.dask_scheduler import main as dask_scheduler
    from distributed.cli.dask_worker import main as dask_worker

    parser = build_parser()
    seen = set()
    for overlay, (_, _, tls) in OVERLAYS.items():
        scheme = "tls" if tls else "tcp"
        for role, cluster, pod in _operator_pods(overlay):
            (container,) = pod["spec"]["containers"]
            args = container["args"]
            env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}
            if role == "scheduler":
                context = dask_scheduler.make_context("dask scheduler", list(args[2:]))
                assert context.params["protocol"] == (scheme if tls else None)
            elif role == "worker":
                dask_worker.make_context("dask worker", list(args[2:]))
                # the operator keeps an address the container sets (the TLS overlay's) and adds its tcp:// one
                assert env["DASK_SCHEDULER_ADDRESS"].startswith(f"{scheme}://{cluster}-scheduler")
            elif role == "service":
                parsed = parser.parse_args(args[1:])
                assert parsed.command == "serve" and parsed.data_root == "/data"
                assert parsed.scheduler == f"{scheme}://scalemb-scheduler:8786"  # the DaskCluster's Service
            else:
                assert args[:2] == ["sh", "-c"]
                assert env["DASK_SCHEDULER_ADDRESS"].startswith(f"{scheme}://{cluster}-scheduler")
                for step in args[2].split("&&"):
                    words = shlex.split(step)
                    if words[0] == "scalemb":
                        parsed = parser.parse_args(words[1:])
                        if parsed.command == "embed":
                            assert parsed.scheduler == "$DASK_SCHEDULER_ADDRESS"
            seen.add(role if role != "job-runner" else "runner")
    assert seen == {"scheduler", "worker", "service", "runner"}


def test_volumes_and_service_wiring():
    for overlay in OVERLAYS:
        stack = _docs(overlay.split("/")[0])
        claim = next(doc for doc in stack if doc["kind"] == "PersistentVolumeClaim")
        assert "ReadWriteMany" in claim["spec"]["accessModes"]
        for role, _, pod in _operator_pods(overlay):
            if role != "scheduler":
                claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"]
                          if "persistentVolumeClaim" in v]
                assert claims == [claim["metadata"]["name"]], (overlay, role)
        deployment = next(doc for doc in stack if doc["kind"] == "Deployment")
        service = next(doc for doc in stack if doc["kind"] == "Service")
        template_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= template_labels.items()
        assert service["spec"]["selector"].items() <= template_labels.items()
        for doc in _docs(overlay):
            if doc["kind"] in ("DaskCluster", "DaskJob"):
                spec = doc["spec"] if doc["kind"] == "DaskCluster" else doc["spec"]["cluster"]["spec"]
                assert spec["scheduler"]["service"]["selector"]["dask.org/cluster-name"] == doc["metadata"]["name"]


# ---------------------------------------------------------------------------- Dask TLS and the HTTP API, for real
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _certificates(directory: Path):
    """A CA and one certificate/key it signed (what the Secret scalemb-dask-tls holds), and a stranger's pair."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def name(text):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])

    def pair(subject, issuer_name, issuer_key, ca):
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(issuer_name or name(subject))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(hours=1))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        cert = builder.sign(issuer_key or key, hashes.SHA256())
        return key, cert

    def write(stem, key, cert):
        (directory / f"{stem}key.pem").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        (directory / f"{stem}cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    ca_key, ca_cert = pair("scalemb-dask-ca", None, None, True)
    (directory / "ca.pem").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    write("", *pair("scalemb-dask", ca_cert.subject, ca_key, False))
    write("stranger-", *pair("stranger", None, None, False))  # self-signed: not from the CA


def _container_env(container, configmaps, remap):
    env = {}
    for source in container.get("envFrom", []):
        env.update(configmaps[source["configMapRef"]["name"]])
    env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})  # not Secrets' values
    return {key: remap(value) for key, value in env.items()}


def _expand(args, env):
    """Kubernetes' ``$(VAR)`` expansion in container args."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), arg) for arg in args]


def _wait_http(url, deadline, processes):
    import urllib.request
    while time.monotonic() < deadline:
        for p in processes:
            assert p.poll() is None, p.args
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status, response.read()
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url}: no answer")


@pytest.mark.slow
def test_prod_dask_tls_and_the_operators_http_api_work_on_loopback(tmp_path):
    """The prod overlay's scheduler and worker commands and environment (TLS settings from its ConfigMap, the
    address the operator leaves in place) run for real on loopback: a client with the service's environment
    computes on the worker over mutual TLS, a client without the CA's certificate is refused, and the HTTP API
    the operator polls (/api/v1/adaptive_target) and the probes' /health answer on the dashboard port."""
    pytest.importorskip("cryptography")
    _certificates(tmp_path)
    docs = _docs("prod")
    configmaps = {doc["metadata"]["name"]: doc["data"] for doc in docs if doc["kind"] == "ConfigMap"}
    pods = {role: pod for role, cluster, pod in _operator_pods("prod")}
    ports = {8786: _free_port(), 8787: _free_port(), 8788: _free_port(), 8789: _free_port(), 8790: _free_port()}

    def remap(value):
        value = value.replace("/etc/dask-tls/", f"{tmp_path}/")
        value = re.sub(r"scalemb-scheduler(\.[\w.-]+)?:8786", f"127.0.0.1:{ports[8786]}", value)
        return value

    def command(role):
        (container,) = pods[role]["spec"]["containers"]
        env = _container_env(container, configmaps, remap)
        args = _expand(container["args"], env)
        args = [re.sub(r"(?<![\d])(878[6-9]|8790)$", lambda m: str(ports[int(m[1])]), a) for a in args]
        args = [a.replace("/tmp", str(tmp_path)) for a in args]
        return [sys.executable, "-m", "dask"] + args[1:], env

    import os
    processes = []
    try:
        for role in ("scheduler", "worker"):
            argv, env = command(role)
            assert any(key.startswith("DASK_DISTRIBUTED__COMM__TLS") for key in env), role
            argv += ["--host", "127.0.0.1"]  # loopback only
            processes.append(subprocess.Popen(argv, env={**os.environ, **env, "DASK_WORKER_NAME": "w0"},
                                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path))
        deadline = time.monotonic() + 60
        status, body = _wait_http(f"http://127.0.0.1:{ports[8787]}/health", deadline, processes)
        assert status == 200 and body == b"ok"
        _wait_http(f"http://127.0.0.1:{ports[8788]}/health", deadline, processes)
        status, body = _wait_http(f"http://127.0.0.1:{ports[8787]}/api/v1/adaptive_target", deadline, processes)
        assert status == 200 and "workers" in __import__("json").loads(body)
        (service,) = pods["service"]["spec"]["containers"]
        service_env = _container_env(service, configmaps, remap)
        address = remap(service["args"][service["args"].index("--scheduler") + 1])
        assert address.startswith("tls://")
        script = ("import dask, distributed, sys\n"
                  "with distributed.Client(sys.argv[1], timeout=20) as c:\n"
                  "    c.wait_for_workers(1, timeout=40)\n"
                  "    print(c.submit(sum, [1, 2, 3]).result())\n")
        ok = subprocess.run([sys.executable, "-c", script, address], env={**os.environ, **service_env},
                            capture_output=True, text=True, timeout=90)
        assert ok.returncode == 0 and ok.stdout.strip() == "6", ok.stderr[-2000:]
        # a peer with a certificate the CA did not sign, and one with none, cannot connect
        stranger = {**service_env, "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": f"{tmp_path}/stranger-cert.pem",
                    "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": f"{tmp_path}/stranger-key.pem"}
        plain = {k: v for k, v in service_env.items() if not k.startswith("DASK_DISTRIBUTED__COMM__")}
        for env, target in ((stranger, address), (plain, address.replace("tls://", "tcp://"))):
            refused = subprocess.run([sys.executable, "-c", script.replace("timeout=20", "timeout=5"), target],
                                     env={**os.environ, **env}, capture_output=True, text=True, timeout=90)
            assert refused.returncode != 0 and refused.stdout.strip() != "6"
    finally:
        for p in processes:
            p.terminate()
        for p in processes:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


# ------------------------------------------------------------------------------- Prometheus scraping, for real
def _option(args, name):
    return args[args.index(name) + 1]


@pytest.mark.slow
@pytest.mark.parametrize("overlay", sorted(MONITORED))
def test_the_service_monitor_scrapes_the_services_metrics(overlay, tmp_path):
    """What the ServiceMonitor tells Prometheus to scrape is the service's metrics: its selector picks the
    Service in front of the service's pods, its port names that Service's port, which leads to the container port
    ``scalemb serve --port`` binds; its bearer token is the Secret key the Deployment mounts as ``--token-file``.
    Then the Deployment's own command, run for real on loopback (without its Dask scheduler), answers the scrape
    (the endpoint's path and scheme, Prometheus' Accept header) with Prometheus text that Prometheus' own parser
    reads into the documented families, and refuses it without the token."""
    import urllib.error
    import urllib.request

    parser = pytest.importorskip("prometheus_client.parser", reason="pip install -e '.[test]' (prometheus-client)")
    docs = _docs(overlay)
    (monitor,) = [doc for doc in docs if doc["kind"] == "ServiceMonitor"]
    (endpoint,) = monitor["spec"]["endpoints"]
    selected = [doc for doc in docs if doc["kind"] == "Service" and doc["metadata"]["namespace"] ==
                monitor["metadata"]["namespace"] and monitor["spec"]["selector"]["matchLabels"].items()
                <= doc["metadata"].get("labels", {}).items()]
    assert [doc["metadata"]["name"] for doc in selected] == ["scalemb-service"]
    (service,) = selected
    (deployment,) = [doc for doc in docs if doc["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    (container,) = pod["spec"]["containers"]
    (container_port,) = [p for p in container["ports"] if p["name"] == port["targetPort"]]
    args = container["args"]
    assert int(_option(args, "--port")) == container_port["containerPort"]
    credentials = endpoint["authorization"]["credentials"]
    assert endpoint["authorization"]["type"] == "Bearer"
    token_file = _option(args, "--token-file")
    (mount,) = [m for m in container["volumeMounts"] if token_file.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == credentials["name"]
    assert {"key": credentials["key"], "path": token_file[len(mount["mountPath"]) + 1:]} in volume["secret"]["items"]

    # the Deployment's command, with this machine's data root, port and token file and no Dask scheduler
    token, local_port = "scrape-token-3", _free_port()
    (tmp_path / "token").write_text(token + "\n")
    (tmp_path / "data").mkdir()
    local = {"--data-root": str(tmp_path / "data"), "--host": "127.0.0.1", "--port": str(local_port),
             "--token-file": str(tmp_path / "token")}
    command = [sys.executable, "-m", "scalemb"] + [local.get(args[k - 1], a) for k, a in enumerate(args) if k]
    scheduler = command.index("--scheduler")
    del command[scheduler:scheduler + 2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCALEMB_")}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        base = f"{endpoint['scheme']}://127.0.0.1:{local_port}"
        assert _wait_http(base + "/health", time.monotonic() + 120, [process])[0] == 200
        accept = ("application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,"
                  "*/*;q=0.1")  # what Prometheus sends
        request = urllib.request.Request(base + endpoint["path"], headers={"Accept": accept})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 401
        request.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
            assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
            text = response.read().decode()
    finally:
        process.terminate()
        process.wait(60)
    families = {family.name: family for family in parser.text_string_to_metric_families(text)}
    assert {name: families[name].type for name in ("scalemb_jobs", "scalemb_queue_length",
                                                   "scalemb_jobs_running_here", "scalemb_iterations",
                                                   "scalemb_info")} == {
        "scalemb_jobs": "gauge", "scalemb_queue_length": "gauge", "scalemb_jobs_running_here": "gauge",
        "scalemb_iterations": "counter", "scalemb_info": "gauge"}
    assert {s.labels["state"] for s in families["scalemb_jobs"].samples} == {"queued", "running", "done", "failed",
                                                                            "cancelled"}
    assert [s.name for s in families["scalemb_iterations"].samples] == ["scalemb_iterations_total"]


# ------------------------------------------------------------------------------------------------ the image
def test_dockerfile_is_slim_non_root_and_installs_the_recommended_extras():
    text = (DEPLOY / "Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert re.fullmatch(r"FROM python:3\.\d+-slim", lines[0])
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    (extras,) = re.findall(r'pip install "\.\[([^\]]+)\]" -c constraints\.txt', text)
    # the service, and what the README recommends for Dask stores, the dashboards and replicas (PostgreSQL)
    assert set(extras.split(",")) == {"service", "arrow", "partition", "anndata", "dashboard", "postgres", "s3"}
    readme = (ROOT / "README.md").read_text()
    for extra in ("arrow", "partition", "postgres", "s3"):
        assert f"scalemb[{extra}]" in readme, extra
    assert not any(line.startswith("ENTRYPOINT") for line in lines)  # Kubernetes args replace CMD
    cmd = next(line for line in lines if line.startswith("CMD "))
    assert build_parser().parse_args(eval(cmd[4:])[1:]).command == "serve"  # noqa: S307 (JSON array literal)
    for copied in re.findall(r"^COPY (.+) \S+$", text, re.M):
        for source in copied.split():
            assert (ROOT / source).exists(), source


def _constraints_module():
    spec = importlib.util.spec_from_file_location("deploy_constraints", DEPLOY / "constraints.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_constraints_pin_exactly_the_closure_of_what_the_image_installs():
    """deploy/constraints.txt pins the closure of the Dockerfile's requirements, derived from the installed
    distributions' metadata (importlib.metadata), and every pin satisfies every specifier that pulls it in."""
    constraints = _constraints_module()
    pins = constraints.read_constraints()
    versions, required_by = constraints.image_closure()
    assert {"pyamg", "bokeh", "pyarrow", "pymetis", "anndata", "numba", "distributed", "fastapi"} <= set(versions)
    assert sorted(set(versions) - set(pins)) == [], "missing from deploy/constraints.txt: python deploy/constraints.py"
    assert sorted(set(pins) - set(versions)) == [], "not in the image's closure: python deploy/constraints.py"
    # A requirer's Requires-Dist is known for the version installed here: where that is not its pin (a machine
    # that resolved pydantic 2.13 while the image pins 2.14), what the pinned version requires cannot be read
    # offline, so only pins required by scalemb itself or by a requirer installed at its pinned version are checked.
    checked = 0
    for name, pairs in required_by.items():
        for requirer, requirement in pairs:
            if requirer != "scalemb" and versions[requirer] != pins[requirer]:
                continue
            checked += 1
            assert requirement.specifier.contains(pins[name], prereleases=True), (name, pins[name], requirer,
                                                                                   str(requirement))
    assert checked >= len(versions) // 2, "most of the closure is installed at other versions than its pins"


def test_closure_follows_markers_and_extras(tmp_path):
    """The closure walks extras (``foo[bar]``) and evaluates markers for the image's Python, and a requirement
    that is not installed is an error naming it and its requirer."""
    from packaging.requirements import Requirement
    constraints = _constraints_module()
    env = constraints.image_environment("3.11")
    versions, _ = constraints.closure([Requirement("dask"), Requirement("zarr; python_version < '3.11'")], env)
    assert "toolz" in versions and "numpy" not in versions and "zarr" not in versions
    versions, _ = constraints.closure([Requirement("dask[array]"), Requirement("zarr; python_version < '3.11'")],
                                      constraints.image_environment("3.10"))
    assert "numpy" in versions and "zarr" in versions
    with pytest.raises(Exception, match="no-such-distribution-x.*required by scalemb"):
        constraints.closure([Requirement("no-such-distribution-x")], env)
    bad = tmp_path / "c.txt"
    bad.write_text("numpy>=2\n")
    with pytest.raises(ValueError, match="c.txt:1"):
        constraints.read_constraints(bad)



# ------------------------------------------------------------------------------ read-only root file system, for real
_READ_ONLY_DRIVER = r'''
import json, os, subprocess, sys, time, urllib.request
spec = json.load(open("/srv/spec.json"))
env = {**os.environ, **spec["env"]}
out = {}
# without the image's cache directory numba cannot cache its kernels on a read-only root: the check can fail
bare = {k: v for k, v in env.items() if k != "NUMBA_CACHE_DIR"}
out["bare"] = subprocess.run([sys.executable, "-c", "import scalemb.lvq.kernels"], env=bare,
                             capture_output=True, text=True).returncode
procs = [subprocess.Popen(argv, env={**env, "DASK_WORKER_NAME": "w0"}, stdout=subprocess.DEVNULL,
                          stderr=open(f"/srv/{i}.log", "w")) for i, argv in enumerate(spec["daemons"])]
try:
    deadline = time.monotonic() + 120
    for url in spec["health"]:
        while True:
            assert time.monotonic() < deadline, url
            assert all(p.poll() is None for p in procs), [p.returncode for p in procs]
            try:
                urllib.request.urlopen(url, timeout=2).read()
                break
            except OSError:
                time.sleep(0.3)
    for name, argv in spec["commands"].items():
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        out[name] = [r.returncode, r.stderr[-3000:]]
finally:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=30)
json.dump(out, open("/srv/out.json", "w"))
'''


@pytest.mark.slow
def test_pods_run_with_a_read_only_root_file_system(tmp_path):
    """L17: the dev overlay's scheduler and worker commands, and a ``scalemb embed`` on them, run in a mount
    namespace whose root file system is read-only, with a fresh tmpfs at /tmp (the emptyDir) and the data volume
    at /srv, under the image's environment (Dockerfile ENV): nothing needs to write anywhere else.  Without
    the image's NUMBA_CACHE_DIR, importing the cached numba kernels fails there (the check can fail)."""
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs unshare -m (root or CAP_SYS_ADMIN) for a read-only root file system")
    import json
    block = (DEPLOY / "Dockerfile").read_text().split("ENV", 1)[1].split("\n\n")[0]
    image_env = dict(re.findall(r"(\w+)=(\S+)", block))
    pods = {role: pod for role, _, pod in _operator_pods("dev")}
    ports = {8786: _free_port(), 8787: _free_port(), 8788: _free_port(), 8789: _free_port(), 8790: _free_port()}

    def argv(role):
        (container,) = pods[role]["spec"]["containers"]
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert "/tmp" in mounts and container["securityContext"]["readOnlyRootFilesystem"]
        args = [re.sub(r"(?<![\d])(878[6-9]|8790)$", lambda m: str(ports[int(m[1])]), a) for a in container["args"]]
        return [sys.executable, "-m", "dask"] + args[1:] + ["--host", "127.0.0.1"]

    scheduler = f"tcp://127.0.0.1:{ports[8786]}"
    spec = {"env": {**image_env, "HOME": "/root", "DASK_SCHEDULER_ADDRESS": scheduler},
            "daemons": [argv("scheduler"), argv("worker")],
            "health": [f"http://127.0.0.1:{ports[8787]}/health", f"http://127.0.0.1:{ports[8788]}/health"],
            "commands": {"embed": [sys.executable, "-m", "scalemb", "embed", "school", "--scheduler", scheduler,
                                   "--iterations", "20", "--out", "/srv/run.zarr", "--quiet"],
                         "kernels": [sys.executable, "-c", "import scalemb.lvq.kernels"]}}
    data = tmp_path / "data"
    data.mkdir()
    (data / "spec.json").write_text(json.dumps(spec))
    (data / "driver.py").write_text(_READ_ONLY_DRIVER)
    script = (f"mount --make-rprivate / && mount --bind {data} /srv && mount -o remount,bind,ro / && "
              f"mount -t tmpfs -o size=2g tmpfs /tmp && cd /srv && exec {sys.executable} /srv/driver.py")
    result = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads((data / "out.json").read_text())
    assert out["embed"][0] == 0, out["embed"][1]
    assert out["kernels"][0] == 0, out["kernels"][1]
    assert out["bare"] != 0
    assert (data / "run.zarr").is_dir()
