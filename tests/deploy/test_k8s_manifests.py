"""The Kubernetes manifests under deploy/k8s (issue 27), checked offline:

- every manifest validates in strict mode (unknown fields refused) against the Kubernetes JSON
  schemas of the pinned versions K8S_VERSIONS, bundled by the PyPI package kubernetes-validate;
- the KubeRay resources (ray.io/v1, which kubernetes-validate has no schema for) validate against
  kuberay_v1_schema.json (written from KubeRay v1.7.0's API; its $comment names the sources), their
  pod templates as core/v1 PodTemplateSpec, and KubeRay's replica rule;
- `kubectl kustomize` renders each kustomization (where kubectl is installed) and what it renders
  validates too;
- deliberately broken copies fail the same checks;
- the manifests agree with each other and with moebatchd: Service and StatefulSet, the driver's
  --servers names and the StatefulSet's pods, probes and ports and the daemon's listen addresses,
  mounts and the configuration's paths, every flag and configuration key a real moebatchd flag
  (`moebatchd --help`), the configuration accepted by the daemon (`moebatchd --dry_run`), and
  max_in_flight above what moebatch-plan says a T4 decodes at once.

Run by scripts/validate_k8s.sh (a venv with kubernetes-validate); moebatchd and moebatch-plan come
from $MOEBATCH_BUILD_DIR (default build/).
"""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml
from kubernetes_validate import utils as kv

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
BUILD = Path(os.environ.get("MOEBATCH_BUILD_DIR", ROOT / "build"))
# The oldest Kubernetes the manifests are meant for, and the newest kubernetes-validate 1.37.0 has.
K8S_VERSIONS = ["1.33.0", "1.37.0"]
KUBERAY_SCHEMA = json.loads((Path(__file__).parent / "kuberay_v1_schema.json").read_text())
HEALTH_SERVICE = "moebatch.v1.BatchService"
KUSTOMIZATIONS = ["base", "statefulset", "ray"]
# Applied per batch, outside the kustomizations.
PER_BATCH = {"statefulset/driver-job.yaml", "statefulset/batch-io.yaml", "ray/rayjob.yaml"}


# -- loading and validating ---------------------------------------------------------------------

def manifest_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


def load(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def all_docs() -> list[dict]:
    return [d for p in manifest_files() for d in load(p)]


def find(kind: str, name: str | None = None) -> dict:
    found = [d for d in all_docs() if d["kind"] == kind and
             (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name}: {len(found)} manifests"
    return found[0]


def validate_core(doc: dict) -> list[str]:
    """kubernetes-validate, strict, at every pinned version; a kind without a schema is an error."""
    errors = []
    for version in K8S_VERSIONS:
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            errors.append(f"{doc['kind']}/{doc['metadata'].get('name')} @ {version}: {path}: "
                          f"{e.message}")
        except kv.SchemaNotFoundError as e:
            errors.append(e.message)
    return errors


def pod_templates(doc: dict) -> list[tuple[str, dict]]:
    """(where, template) of a KubeRay resource's pod templates."""
    spec = doc.get("spec", {})
    out = []
    cluster = spec.get("rayClusterSpec", spec) if doc["kind"] == "RayJob" else spec
    if isinstance(cluster.get("headGroupSpec", {}).get("template"), dict):
        out.append(("headGroupSpec.template", cluster["headGroupSpec"]["template"]))
    for i, group in enumerate(cluster.get("workerGroupSpecs", []) or []):
        if isinstance(group.get("template"), dict):
            out.append((f"workerGroupSpecs[{i}].template", group["template"]))
    if isinstance(spec.get("submitterPodTemplate"), dict):
        out.append(("submitterPodTemplate", spec["submitterPodTemplate"]))
    return out


def validate_kuberay(doc: dict) -> list[str]:
    kind = doc.get("kind")
    name = f"{kind}/{doc.get('metadata', {}).get('name')}"
    if kind not in KUBERAY_SCHEMA["$defs"] or kind not in ("RayCluster", "RayJob"):
        return [f"{name}: no schema for {doc.get('apiVersion')} {kind}"]
    # The kind's own definition, so that an error names its field (not "not valid under any").
    schema = {**{k: v for k, v in KUBERAY_SCHEMA.items() if k != "oneOf"},
              "$ref": f"#/$defs/{kind}"}
    errors = []
    for e in jsonschema.Draft202012Validator(schema).iter_errors(doc):
        why = "; ".join([e.message] + [c.message for c in e.context])
        errors.append(f"{name}: {e.json_path}: {why}")
    for where, template in pod_templates(doc):
        # A core/v1 PodTemplate holds a PodTemplateSpec as `template`: its schema checks it.
        wrapper = {"apiVersion": "v1", "kind": "PodTemplate",
                   "metadata": {"name": "kuberay-template"}, "template": template}
        errors += [f"{name} {where}: {e}" for e in validate_core(wrapper)]
    spec = doc.get("spec", {})
    cluster = spec.get("rayClusterSpec", spec) if doc.get("kind") == "RayJob" else spec
    for group in cluster.get("workerGroupSpecs", []) or []:
        low, high = group.get("minReplicas", 0), group.get("maxReplicas", 2**31 - 1)
        if isinstance(low, int) and isinstance(high, int):
            if low > high:
                errors.append(f"{name}: worker group {group.get('groupName')}: "
                              f"minReplicas {low} > maxReplicas {high}")
            replicas = group.get("replicas", low)
            if isinstance(replicas, int) and not low <= replicas <= high:
                errors.append(f"{name}: worker group {group.get('groupName')}: replicas "
                              f"{replicas} outside [{low}, {high}]")
    return errors


def validate_doc(doc: dict) -> list[str]:
    if doc.get("apiVersion", "").startswith("ray.io/"):
        return validate_kuberay(doc)
    return validate_core(doc)


def validate_file(path: Path) -> list[str]:
    return [e for doc in load(path) for e in validate_doc(doc)]


# -- schema validation --------------------------------------------------------------------------

def test_every_manifest_is_found():
    names = {p.relative_to(K8S).as_posix() for p in manifest_files()}
    assert {"base/moebatchd-config.yaml", "base/moebatch-tokens.yaml", "statefulset/service.yaml",
            "statefulset/statefulset.yaml", "statefulset/driver-job.yaml",
            "ray/raycluster.yaml", "ray/rayjob.yaml"} <= names
    kinds = {d["kind"] for d in all_docs()}
    assert {"ConfigMap", "Secret", "PersistentVolumeClaim", "Service", "StatefulSet", "Job",
            "Pod", "RayCluster", "RayJob"} <= kinds


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.relative_to(K8S).as_posix())
def test_manifest_validates(path):
    docs = load(path)
    assert docs, f"{path}: no document"
    assert validate_file(path) == []


def kustomization(directory: Path) -> dict:
    return yaml.safe_load((directory / "kustomization.yaml").read_text())


def test_kustomizations_name_every_manifest():
    """Every manifest is in a kustomization, or one of those applied per batch, and every
    resource a kustomization names exists."""
    listed = set()
    for name in KUSTOMIZATIONS:
        directory = K8S / name
        for resource in kustomization(directory).get("resources", []):
            target = (directory / resource).resolve()
            assert target.exists(), f"{name}/kustomization.yaml: {resource} does not exist"
            if target.is_file():
                listed.add(target.relative_to(K8S).as_posix())
    files = {p.relative_to(K8S).as_posix() for p in manifest_files()}
    assert files - listed == PER_BATCH


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_kustomize_renders_valid_manifests(name):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (its `kubectl kustomize` renders the overlays)")
    run = subprocess.run([kubectl, "kustomize", str(K8S / name)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    docs = [d for d in yaml.safe_load_all(run.stdout) if d]
    rendered = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("ConfigMap", "moebatchd-config"), ("Secret", "moebatch-tokens")} <= rendered
    if name == "statefulset":
        assert {("StatefulSet", "moebatchd"), ("Service", "moebatchd")} <= rendered
    if name == "ray":
        assert {("RayCluster", "moebatch-ray"), ("ConfigMap", "moebatch-ray-scripts")} <= rendered
        scripts = next(d for d in docs if d["metadata"]["name"] == "moebatch-ray-scripts")
        assert scripts["data"]["gpu_daemons.py"] == (K8S / "ray" / "gpu_daemons.py").read_text()
    assert [e for d in docs for e in validate_doc(d)] == []


def write_broken(tmp_path: Path, source: str, mutate) -> Path:
    docs = load(K8S / source)
    mutate(docs[0])
    path = tmp_path / Path(source).name
    path.write_text(yaml.safe_dump_all(docs))
    return path


def daemon_container(pod_spec: dict) -> dict:
    return next(c for c in pod_spec["containers"] if c.get("command", [""])[0] == "moebatchd")


BROKEN = {
    # strict mode: a misspelt field
    "statefulset: spec.replica": ("statefulset/statefulset.yaml", lambda d: d["spec"].update(
        replica=d["spec"].pop("replicas")), "replica"),
    # a gRPC probe's port is a number, not a port name
    "statefulset: grpc probe port by name": (
        "statefulset/statefulset.yaml",
        lambda d: daemon_container(d["spec"]["template"]["spec"])["readinessProbe"]["grpc"]
        .update(port="grpc"), "readinessProbe.grpc.port"),
    "service: clusterIP a number": ("statefulset/service.yaml",
                                    lambda d: d["spec"].update(clusterIP=0), "clusterIP"),
    "job: container without a name": (
        "statefulset/driver-job.yaml",
        lambda d: d["spec"]["template"]["spec"]["containers"][0].pop("name"), "name"),
    "raycluster: worker group without groupName": (
        "ray/raycluster.yaml", lambda d: d["spec"]["workerGroupSpecs"][0].pop("groupName"),
        "groupName"),
    "raycluster: unknown field in a worker's pod template": (
        "ray/raycluster.yaml",
        lambda d: d["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][1].update(
            imagePullPolicyy="Always"), "imagePullPolicyy"),
    "raycluster: minReplicas above maxReplicas": (
        "ray/raycluster.yaml",
        lambda d: d["spec"]["workerGroupSpecs"][0].update(minReplicas=200), "minReplicas"),
    "raycluster: unknown spec field": ("ray/raycluster.yaml", lambda d: d["spec"].update(
        workerGroupSpec=[]), "workerGroupSpec"),
    "rayjob: neither a cluster selector nor a cluster spec": (
        "ray/rayjob.yaml", lambda d: d["spec"].pop("clusterSelector"), "rayClusterSpec"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_copy_fails(tmp_path, case):
    source, mutate, word = BROKEN[case]
    assert validate_file(K8S / source) == []
    errors = validate_file(write_broken(tmp_path, source, mutate))
    assert errors, f"{case}: the broken copy validated"
    assert any(word in e for e in errors), errors


# -- consistency --------------------------------------------------------------------------------

def daemon_flags() -> set[str]:
    binary = BUILD / "server" / "moebatchd"
    assert binary.exists(), f"{binary} is not built (scripts/build.sh; MOEBATCH_BUILD_DIR)"
    run = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60)
    flags = set(re.findall(r"^    --(\w+) \(", run.stdout + run.stderr, re.M))
    assert len(flags) > 30, run.stdout + run.stderr
    return flags


def daemon_config() -> dict:
    return json.loads(find("ConfigMap", "moebatchd-config")["data"]["moebatchd.json"])


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def daemon_pod_specs() -> list[tuple[str, dict]]:
    """(where, pod spec) of every pod that runs moebatchd."""
    sts = find("StatefulSet", "moebatchd")
    ray = find("RayCluster", "moebatch-ray")
    return [("StatefulSet", sts["spec"]["template"]["spec"]),
            ("RayCluster gpu workers", ray["spec"]["workerGroupSpecs"][0]["template"]["spec"])]


def test_daemon_flags_and_config_keys_are_real():
    flags = daemon_flags()
    used = []
    for where, spec in daemon_pod_specs():
        container = daemon_container(spec)
        for token in container["command"] + container.get("args", []):
            if token.startswith("--"):
                used.append((where, token[2:].split("=")[0].replace("-", "_")))
    assert ("StatefulSet", "config") in used
    assert [u for u in used if u[1] not in flags] == []
    keys = [k.replace("-", "_") for k in daemon_config() if not k.startswith("#")]
    assert len(keys) > 10
    assert sorted(set(keys) - flags) == []
    # The check can fail: a made-up name is not among the flags.
    assert "max_inflight" not in flags


def dry_run(config: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """moebatchd --dry_run on `config`, with the paths of this checkout and the cpu backend (the
    cuda one needs a device): the daemon parses every key and prints its plan."""
    tokens = tmp_path / "tokens.json"
    tokens.write_text(find("Secret", "moebatch-tokens")["stringData"]["tokens.json"])
    return subprocess.run(
        [str(BUILD / "server" / "moebatchd"), "--config", str(config),
         "--model", str(ROOT / "bench" / "models" / "mixtral-8x7b"),
         "--tokens_file", str(tokens), "--data_dir", str(tmp_path / "data"),
         "--backend", "cpu", "--dry_run"], capture_output=True, text=True, timeout=120)


def test_daemon_accepts_the_config(tmp_path):
    assert json.loads(find("Secret", "moebatch-tokens")["stringData"]["tokens.json"]) == \
        {"tokens": []}
    config = tmp_path / "moebatchd.json"
    config.write_text(json.dumps(daemon_config()))
    run = dry_run(config, tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    weights = re.search(r"^weights\s+host, \w+: ([\d.]+) GiB", run.stdout, re.M)
    assert weights, run.stdout
    # The weights and the KV cache fit in host_memory_gb (and 1 GiB more), which fits in the
    # daemon container's memory limit.
    cfg = daemon_config()
    assert float(weights.group(1)) + cfg["kv_cache_gb"] + 1 <= cfg["host_memory_gb"]
    for where, spec in daemon_pod_specs():
        limit = daemon_container(spec)["resources"]["limits"]["memory"]
        assert limit.endswith("Gi") and int(limit[:-2]) > cfg["host_memory_gb"], where
    # The check can fail: the daemon refuses an unknown key.
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**daemon_config(), "max_inflight": 1}))
    run = dry_run(bad, tmp_path)
    assert run.returncode != 0 and "max_inflight" in run.stderr


def test_cpu_threads_match_every_daemon_containers_cpu_request():
    cfg = daemon_config()
    pods = [find("StatefulSet", "moebatchd")["spec"]["template"]["spec"]]
    cluster = find("RayCluster")["spec"]
    pods += [g["template"]["spec"] for g in cluster.get("workerGroupSpecs", [])
             if any(c.get("command", [""])[0] == "moebatchd" for c in g["template"]["spec"]["containers"])]
    assert len(pods) >= 2
    for pod in pods:
        assert str(cfg["cpu_threads"]) == daemon_container(pod)["resources"]["requests"]["cpu"]


def test_max_in_flight_covers_what_a_t4_decodes_at_once():
    cfg = daemon_config()
    assert cfg["gpu_memory_gb"] == 16  # a T4
    run = subprocess.run([str(BUILD / "engine" / "moebatch-plan"), "--preset", "mixtral-8x7b",
                          "--gpu", "t4", "--kv_cache_gb", str(cfg["kv_cache_gb"])],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    decoding = re.search(r"decoding \(eq\. 9\)\s+g q = (\d+) sequences", run.stdout)
    assert decoding, run.stdout
    assert cfg["max_in_flight"] >= int(decoding.group(1))


def test_service_matches_statefulset():
    service, sts = find("Service", "moebatchd"), find("StatefulSet", "moebatchd")
    assert service["spec"]["clusterIP"] == "None"  # headless: a DNS name per pod
    assert sts["spec"]["serviceName"] == service["metadata"]["name"]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    container = daemon_container(sts["spec"]["template"]["spec"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for port in service["spec"]["ports"]:
        assert ports[port["targetPort"]] == port["port"], port
    cfg = daemon_config()
    assert ports["grpc"] == port_of(cfg["listen"])
    assert ports["metrics"] == port_of(cfg["metrics_listen"])
    assert ports["http"] == port_of(cfg["http_listen"])


@pytest.mark.parametrize("index", [0, 1])
def test_daemon_pods(index):
    """Probes on the daemon's gRPC port and health service, one GPU, a grace period above the
    drain, and mounts where the configuration's paths are."""
    where, spec = daemon_pod_specs()[index]
    cfg = daemon_config()
    container = daemon_container(spec)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"] == {"port": port_of(cfg["listen"]),
                                            "service": HEALTH_SERVICE}, (where, probe)
    # The startup probe allows at least 30 min for the model to load.
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert spec["terminationGracePeriodSeconds"] > cfg["drain_timeout_s"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    claim_templates = set()
    if where == "StatefulSet":
        sts = find("StatefulSet", "moebatchd")
        claim_templates = {t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]}
    for mount in mounts.values():
        assert mount["name"] in volumes or mount["name"] in claim_templates, mount

    def volume_of(path: str) -> tuple[str, dict]:
        parents = [m for m in mounts if path == m or path.startswith(m.rstrip("/") + "/")]
        assert parents, f"{where}: {path} is on no volume"
        mount = mounts[max(parents, key=len)]
        return path[len(mount["mountPath"]):].lstrip("/"), mount

    assert " ".join(container["command"]).startswith("moebatchd --config ")
    config_path = container["command"][container["command"].index("--config") + 1]
    rest, mount = volume_of(config_path)
    assert volumes[mount["name"]]["configMap"]["name"] == "moebatchd-config"
    assert rest in find("ConfigMap", "moebatchd-config")["data"]
    rest, mount = volume_of(cfg["tokens_file"])
    secret = volumes[mount["name"]]["secret"]
    assert secret["secretName"] == "moebatch-tokens"
    assert {"key": "tokens.json", "path": rest} in secret["items"]
    rest, mount = volume_of(cfg["data_dir"])
    assert rest == "" and not mount.get("readOnly")
    assert mount["name"] in claim_templates or "ephemeral" in volumes[mount["name"]]
    rest, mount = volume_of(cfg["model"])
    assert mount.get("readOnly")
    assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"] == "moebatch-models"
    # Every other path the daemon writes is on a volume too: its root file system is read-only.
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert "/tmp" in mounts


def test_driver_servers_are_the_statefulset_pods():
    """The Job's --servers lists moebatchd-0 .. moebatchd-<replicas-1> by their headless-Service
    names on the gRPC port: every daemon once, no name that resolves to no pod."""
    job, sts = find("Job", "moebatch-shard"), find("StatefulSet", "moebatchd")
    service = find("Service", sts["spec"]["serviceName"])
    grpc_port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc")
    driver = job["spec"]["template"]["spec"]["containers"][0]
    argv = driver["command"] + driver["args"]
    assert argv[:3] == ["moebatch", "shard", "/input/batch.jsonl"]
    assert argv[argv.index("-o") + 1] == "/output/results.jsonl"
    servers = argv[argv.index("--servers") + 1].split(",")
    pattern = re.compile(rf"^{sts['metadata']['name']}-(\d+)\.{service['metadata']['name']}:(\d+)$")
    ordinals = []
    for server in servers:
        match = pattern.match(server)
        assert match, f"{server} is not <statefulset>-<ordinal>.<service>:<port>"
        assert int(match.group(2)) == grpc_port, server
        ordinals.append(int(match.group(1)))
    assert sorted(ordinals) == list(range(sts["spec"]["replicas"]))
    # The token the daemons' tokens file accepts, from the same Secret.
    env = {e["name"]: e for e in driver["env"]}
    assert env["MOEBATCH_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "moebatch-tokens",
                                                                  "key": "driver-token"}
    assert "driver-token" in find("Secret", "moebatch-tokens")["stringData"]
    mounts = {m["mountPath"]: m for m in driver["volumeMounts"]}
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    for path in ("/input", "/output"):
        claim = volumes[mounts[path]["name"]]["persistentVolumeClaim"]["claimName"]
        assert claim == "moebatch-batch"
        find("PersistentVolumeClaim", claim)
    assert not mounts["/output"].get("readOnly")


def test_rayjob_runs_on_the_raycluster():
    ray, job = find("RayCluster", "moebatch-ray"), find("RayJob", "moebatch-shard-ray")
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": ray["metadata"]["name"]}
    entry = job["spec"]["entrypoint"]
    workers = ray["spec"]["workerGroupSpecs"][0]
    assert workers["rayStartParams"]["num-gpus"] == "1"
    script = re.search(r"python (\S+/gpu_daemons\.py) --port (\d+) --min (\d+)", entry)
    assert script, entry
    assert int(script.group(2)) == port_of(daemon_config()["listen"])
    assert int(script.group(3)) == workers["replicas"]
    assert re.search(r"moebatch shard /input/batch\.jsonl --servers \"\$servers\" "
                     r"-o /output/results\.jsonl", entry), entry
    # The script is mounted where the entrypoint runs it (on the head).
    head = ray["spec"]["headGroupSpec"]["template"]["spec"]
    mounts = {m["mountPath"]: m for m in head["containers"][0]["volumeMounts"]}
    directory = str(Path(script.group(1)).parent)
    volume = next(v for v in head["volumes"] if v["name"] == mounts[directory]["name"])
    assert volume["configMap"]["name"] == "moebatch-ray-scripts"
    generated = kustomization(K8S / "ray")["configMapGenerator"][0]
    assert generated["name"] == "moebatch-ray-scripts" and generated["files"] == ["gpu_daemons.py"]
    assert generated["options"]["disableNameSuffixHash"] is True
    # The image's Ray is the cluster's.
    dockerfile = (K8S / "Dockerfile").read_text()
    assert f"ARG RAY_VERSION={ray['spec']['rayVersion']}\n" in dockerfile


def test_gpu_daemons_lists_the_gpu_nodes():
    spec = importlib.util.spec_from_file_location("gpu_daemons", K8S / "ray" / "gpu_daemons.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    nodes = [
        {"NodeManagerAddress": "10.0.0.9", "Alive": True, "Resources": {"CPU": 4.0}},  # the head
        {"NodeManagerAddress": "10.0.1.2", "Alive": True, "Resources": {"CPU": 2.0, "GPU": 1.0}},
        {"NodeManagerAddress": "10.0.1.1", "Alive": True, "Resources": {"CPU": 2.0, "GPU": 1.0}},
        {"NodeManagerAddress": "10.0.1.3", "Alive": False, "Resources": {"GPU": 1.0}},  # lost
        {"NodeManagerAddress": "fd00::7", "Alive": True, "Resources": {"GPU": 1.0}},
    ]
    assert module.endpoints(nodes, 50051) == ["10.0.1.1:50051", "10.0.1.2:50051",
                                              "[fd00::7]:50051"]
    assert module.endpoints(copy.deepcopy(nodes[:1]), 50051) == []
