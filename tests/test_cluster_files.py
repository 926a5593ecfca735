"""The deployment files in cluster/, checked against the real schemas.

- the Ray cluster-launcher YAML against Ray's own autoscaler schema
  (``ray/autoscaler/ray-schema.json`` of the installed Ray) and Ray's ``validate_config``;
- the KubeRay manifests against the ``v1`` OpenAPI schema of KubeRay's CRDs
  (``../shared/schemas/kuberay``), plus what the operator needs beyond the schema;
- no secrets committed anywhere under cluster/;
- the local-cluster scripts are strict bash that stop processes by pid only.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "cluster"
SHARED = Path(__file__).resolve().parents[2] / "shared"
KUBERAY = SHARED / "schemas" / "kuberay"
LAUNCHER = CLUSTER / "aws" / "haepo-cluster.yaml"
K8S = CLUSTER / "kubernetes"

jsonschema = pytest.importorskip("jsonschema")


# PyYAML's safe loader in C (libyaml, in PyYAML's wheels): KubeRay's CRDs are 0.9 and 1.4 MB,
# 12 s to parse in pure Python on a busy 2-core machine, 1.7 s with libyaml.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(path: Path):
    return yaml.load(path.read_text(), Loader=SAFE_LOADER)


def load_all(path: Path) -> list:
    return [d for d in yaml.load_all(path.read_text(), Loader=SAFE_LOADER) if d is not None]


# --------------------------------------------------------------------------- launcher


def ray_schema() -> dict:
    import ray

    return json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())


def test_launcher_yaml_passes_ray_schema():
    jsonschema.validate(load(LAUNCHER), ray_schema())


def test_launcher_yaml_passes_ray_validate_config():
    """What `ray up` does before it launches anything: fill in the provider's defaults, then
    validate (offline: no cloud call)."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(load(LAUNCHER)))
    validate_config(prepared)
    assert prepared["available_node_types"]["head"]["max_workers"] == 0


def test_schema_check_is_live():
    """The schema does reject a broken config (a node type without node_config)."""
    bad = load(LAUNCHER)
    del bad["available_node_types"]["gpu_worker"]["node_config"]
    with pytest.raises(jsonschema.ValidationError, match="node_config"):
        jsonschema.validate(bad, ray_schema())


def test_launcher_topology_auth_and_dashboard():
    cfg = load(LAUNCHER)
    types = cfg["available_node_types"]
    head = types[cfg["head_node_type"]]
    assert head["resources"] == {"CPU": 0}, "the head runs no trials"
    gpu = types["gpu_worker"]
    assert gpu["min_workers"] == 0 and gpu["max_workers"] >= 1, "GPU workers autoscale from 0"
    assert gpu["node_config"]["InstanceType"].startswith(("g", "p")), "a GPU instance type"
    assert gpu["max_workers"] <= cfg["max_workers"]

    start = " ".join(cfg["head_start_ray_commands"] + cfg["worker_start_ray_commands"])
    assert start.count("RAY_AUTH_MODE=token ray start") == 2, "token auth on every node"
    head_start = " ".join(cfg["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head_start, "dashboard on the head's loopback only"
    assert "--num-cpus=0" in head_start
    assert cfg["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    # Only SSH open to the outside.
    perms = cfg["provider"]["security_group"]["IpPermissions"]
    assert [(p["FromPort"], p["ToPort"]) for p in perms] == [(22, 22)]
    for p in perms:
        for r in p.get("IpRanges", []):
            assert r["CidrIp"] != "0.0.0.0/0", "SSH must not be open to the whole internet"
    # haepo-ray on every node: this repository synced and installed by setup_commands.
    assert cfg["file_mounts"]["~/haepo-ray"] == "."
    assert any("pip install" in c and "~/haepo-ray" in c for c in cfg["setup_commands"])
    # Jobs inherit the tracking server and the shared storage from cluster.env.
    env_example = (CLUSTER / "aws" / "cluster.env.example").read_text()
    for key in ("MLFLOW_TRACKING_URI", "HAEPO_STORAGE_PATH=s3://"):
        assert key in env_example


# --------------------------------------------------------------------------- KubeRay


@functools.cache  # parsed once; the tests only read it
def crd_schema(name: str) -> dict:
    if not KUBERAY.is_dir():
        pytest.skip(f"KubeRay CRDs not found at {KUBERAY} (../shared/schemas/kuberay beside the repo)")
    crd = load(KUBERAY / name)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


MANIFESTS = {"raycluster.yaml": "ray.io_rayclusters.yaml", "rayjob.yaml": "ray.io_rayjobs.yaml"}


@pytest.mark.parametrize("manifest", sorted(MANIFESTS))
def test_kuberay_manifest_matches_crd(manifest):
    (doc,) = load_all(K8S / manifest)
    schema = crd_schema(MANIFESTS[manifest])
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)
    assert doc["apiVersion"] == "ray.io/v1"
    assert doc["kind"] == {"raycluster.yaml": "RayCluster", "rayjob.yaml": "RayJob"}[manifest]


def test_crd_check_is_live():
    """The CRD schema does reject what the operator would refuse: a worker group without
    maxReplicas, a container without a name, a non-string rayStartParams value."""
    validator = jsonschema.Draft7Validator(crd_schema("ray.io_rayclusters.yaml"))
    good = load(K8S / "raycluster.yaml")
    for breaks, needle in (
        (lambda d: d["spec"]["workerGroupSpecs"][0].pop("maxReplicas"), "maxReplicas"),
        (lambda d: d["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0].pop("name"), "name"),
        (lambda d: d["spec"]["headGroupSpec"]["rayStartParams"].update({"num-cpus": 0}), "string"),
    ):
        bad = copy.deepcopy(good)
        breaks(bad)
        messages = [e.message for e in validator.iter_errors(bad)]
        assert any(needle in m for m in messages), messages


def _containers(group: dict) -> list[dict]:
    return group["template"]["spec"]["containers"]


def test_raycluster_has_what_the_operator_and_we_need():
    import ray

    rc = load(K8S / "raycluster.yaml")
    spec = rc["spec"]
    assert spec["rayVersion"] == ray.__version__, "pods run the Ray version the client has"
    assert spec["authOptions"]["mode"] == "token"
    assert spec["enableInTreeAutoscaling"] is True
    head = spec["headGroupSpec"]
    assert head["serviceType"] == "ClusterIP" and not head.get("enableIngress"), \
        "dashboard not exposed outside the cluster"
    assert head["rayStartParams"]["num-cpus"] == "0"
    images = {c["image"] for c in _containers(head)}
    groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    gpu = groups["gpu"]
    assert gpu["minReplicas"] == 0 < gpu["maxReplicas"]
    assert gpu["minReplicas"] <= gpu.get("replicas", 0) <= gpu["maxReplicas"]
    (worker,) = _containers(gpu)
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert worker["resources"]["requests"]["nvidia.com/gpu"] == worker["resources"]["limits"]["nvidia.com/gpu"]
    assert any(t["key"] == "nvidia.com/gpu" for t in gpu["template"]["spec"]["tolerations"])
    for name, group in groups.items():
        for c in _containers(group):
            images.add(c["image"])
            if name != "gpu":
                assert "nvidia.com/gpu" not in c["resources"].get("limits", {}), "CPU group holds no GPU"
    assert len(images) == 1, f"one image everywhere, got {images}"

    # Shared storage: the same volume, mounted at the same place, on every node; the storage
    # path every node is told is on it.
    def mounts(group):
        (c,) = [c for c in _containers(group) if c["name"].startswith("ray-")]
        env = {e["name"]: e for e in c.get("env", [])}
        vols = {v["name"]: v for v in group["template"]["spec"]["volumes"]}
        return env, {m["mountPath"]: vols[m["name"]] for m in c["volumeMounts"]}

    for group in [head, *groups.values()]:
        env, by_path = mounts(group)
        storage = env["HAEPO_STORAGE_PATH"]["value"]
        (mount,) = [p for p in by_path if storage.startswith(p + "/")]
        assert by_path[mount]["persistentVolumeClaim"]["claimName"] == "haepo-shared"
    (pvc,) = load_all(K8S / "storage.yaml")
    assert pvc["metadata"]["name"] == "haepo-shared" and pvc["spec"]["accessModes"] == ["ReadWriteMany"]

    # MLflow: the head knows the server and logs in with credentials from a Secret.
    env, _ = mounts(head)
    assert env["MLFLOW_TRACKING_URI"]["value"] == "http://haepo-mlflow:5000"
    for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        assert "secretKeyRef" in env[key]["valueFrom"]


def test_rayjob_runs_a_sweep_spec_on_the_cluster():
    from haepo_ray.sweep.kinds import load_spec

    job = load(K8S / "rayjob.yaml")
    rc = load(K8S / "raycluster.yaml")
    assert job["spec"]["clusterSelector"]["ray.io/cluster"] == rc["metadata"]["name"]
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:2] == ["haepo", "sweep"]
    spec_in_image = argv[2]
    assert spec_in_image.startswith("/opt/haepo/tune_configs/"), "a spec baked into the image"
    local = REPO / "tune_configs" / Path(spec_in_image).name
    assert local.is_file(), f"{local} (copied into the image by cluster/docker/Dockerfile)"
    load_spec(local)
    assert argv[argv.index("--address") + 1] == "auto"
    storage = argv[argv.index("--storage-path") + 1]
    assert "$" not in storage, "the submitter pod's shell would expand it (empty there)"
    head_env = {e["name"]: e for e in _containers(rc["spec"]["headGroupSpec"])[0]["env"]}
    assert storage == head_env["HAEPO_STORAGE_PATH"]["value"]
    assert "COPY --chown=ray:users tune_configs" in (CLUSTER / "docker" / "Dockerfile").read_text()
    # a stopped RayJob's driver gets the time haepo submit's jobs get to end its sweep after SIGTERM
    from haepo_ray.jobs import STOP_WAIT_S

    env_vars = yaml.safe_load(job["spec"]["runtimeEnvYAML"])["env_vars"]
    assert env_vars["RAY_JOB_STOP_WAIT_TIME_S"] == str(STOP_WAIT_S)


def test_kubernetes_documents_are_well_formed():
    for path in sorted(K8S.glob("*.yaml")):
        docs = load_all(path)
        assert docs, path
        for doc in docs:
            assert {"apiVersion", "kind", "metadata"} <= set(doc), f"{path}: {doc.get('kind')}"
            assert doc["metadata"].get("name"), f"{path}: {doc['kind']} without a name"


def _secret_refs(node, out: set) -> set:
    if isinstance(node, dict):
        ref = node.get("secretKeyRef")
        if isinstance(ref, dict):
            out.add((ref["name"], ref["key"]))
        for value in node.values():
            _secret_refs(value, out)
    elif isinstance(node, list):
        for value in node:
            _secret_refs(value, out)
    return out


def test_every_secret_referenced_is_created_in_the_readme():
    refs: set = set()
    for path in K8S.glob("*.yaml"):
        for doc in load_all(path):
            _secret_refs(doc, refs)
    assert refs, "credentials come from Kubernetes Secrets"
    readme = (CLUSTER / "README.md").read_text()
    for name, key in sorted(refs):
        pattern = rf"kubectl create secret generic {re.escape(name)}\b[^\n]*--from-literal={re.escape(key)}="
        assert re.search(pattern, readme), f"README does not say how to create secret {name} (key {key})"


def test_mlflow_server_has_auth_postgres_and_proxied_artifacts():
    script = (CLUSTER / "mlflow" / "start-mlflow.sh").read_text()
    assert "--app-name basic-auth" in script
    assert "--serve-artifacts" in script and "--artifacts-destination" in script
    assert "postgresql+psycopg2://" in script
    compose = load(CLUSTER / "mlflow" / "docker-compose.yaml")
    assert compose["services"]["postgres"]["image"].startswith("postgres:")
    # Room for the server's pools: 4 workers x 2 databases x (5 + 10) connections.
    assert compose["services"]["postgres"]["command"] == ["-c", "max_connections=200"]
    (db,) = [d for d in load_all(K8S / "mlflow.yaml") if d["kind"] == "StatefulSet"]
    assert db["spec"]["template"]["spec"]["containers"][0]["args"] == ["-c", "max_connections=200"]
    assert compose["services"]["mlflow"]["env_file"] == "mlflow.env"


def test_mlflow_start_script_keeps_passwords_off_the_command_line(tmp_path):
    """Runs start-mlflow.sh with a stand-in `mlflow` that records what it was given: the
    backend store goes through the environment, the auth settings file parses with MLflow's
    own reader, passwords with URL / configparser specials survive, argv holds no secret."""
    fake = tmp_path / "bin" / "mlflow"
    fake.parent.mkdir()
    fake.write_text(
        f"#!{sys.executable}\n"
        "import importlib.util, json, os, sys\n"
        "import mlflow.server\n"
        # MLflow's own reader of the auth settings (loaded by path: the auth package's
        # __init__ needs Flask-WTF, i.e. mlflow[auth], which the server image installs).
        "path = os.path.join(os.path.dirname(mlflow.server.__file__), 'auth', 'config.py')\n"
        "spec = importlib.util.spec_from_file_location('auth_config', path)\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        "c = mod.read_auth_config()\n"
        "print(json.dumps({'argv': sys.argv[1:], 'backend': os.environ['MLFLOW_BACKEND_STORE_URI'],\n"
        "                  'auth_db': c.database_uri, 'admin': c.admin_username,\n"
        "                  'admin_password': c.admin_password, 'default': c.default_permission}))\n"
    )
    fake.chmod(0o755)
    password = "p%w@d:/x"
    env = {
        "PATH": f"{fake.parent}:{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "POSTGRES_HOST": "db", "POSTGRES_USER": "mlflow", "POSTGRES_PASSWORD": password,
        "MLFLOW_AUTH_ADMIN_PASSWORD": "admin-secret",
        "MLFLOW_ARTIFACTS_DESTINATION": "s3://bucket/mlflow",
    }
    out = subprocess.run(["bash", str(CLUSTER / "mlflow" / "start-mlflow.sh")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["backend"] == "postgresql+psycopg2://mlflow:p%25w%40d%3A%2Fx@db:5432/mlflow"
    assert got["auth_db"] == "postgresql+psycopg2://mlflow:p%25w%40d%3A%2Fx@db:5432/mlflow_auth"
    assert got["admin"] == "admin" and got["admin_password"] == "admin-secret"
    assert got["default"] == "EDIT"
    assert "basic-auth" in got["argv"] and "--serve-artifacts" in got["argv"]
    assert not any(password in a or "p%25w" in a or "admin-secret" in a for a in got["argv"])

    missing = subprocess.run(["bash", str(CLUSTER / "mlflow" / "start-mlflow.sh")],
                             env={k: v for k, v in env.items() if k != "POSTGRES_PASSWORD"},
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0 and "POSTGRES_PASSWORD" in missing.stderr


# --------------------------------------------------------------------------- secrets


# key: value or key=value where the key names a secret.
SECRET_ASSIGNMENT = re.compile(
    r"""(?ix)
    (?P<key>[A-Za-z0-9_.-]*(?:password|passwd|secret|token|api[_-]?key|access[_-]?key)[A-Za-z0-9_.-]*)
    ["']?\s*[:=]\s*
    (?P<value>[^\s#,}\]]*)
    """
)
# Values that are not secrets: empty, references, placeholders, file paths, code.
SAFE_VALUE = re.compile(
    r"""(?x)^(
        |["']{2}                                  # ""
        |\$.*|.*\$\{.*                            # $VAR, ${VAR}
        |<.*                                      # <placeholder>, <two words>
        |[A-Z][A-Z0-9_]*                          # YOUR_PLACEHOLDER
        |[~/.].*|.*/.*                            # paths
        |\{.*|\[.*                                # a mapping / list follows (secretKeyRef)
        |%s|.*environ.*|.*getenv.*                # printf slot, environment lookups
        |(str|int|float|bool|bytes|Path|None)[]),|]*   # Python annotations
        |valueFrom|secretKeyRef|true|false|null|none|token|disabled|auth_token|password|username
    )$"""
)
LEAK_PATTERNS = {
    "private key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    "AWS access key id": re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"),
    "long hex literal (a token?)": re.compile(r"(?<![A-Za-z0-9/+_-])[0-9a-f]{32,}(?![A-Za-z0-9])"),
    "credentials in a URL": re.compile(r"://[^/\s:@$]+:[^/\s@${}]+@"),
}


def _code_part(line: str) -> str:
    """The line without its comment (``#`` / SQL ``--``) and with ``${...}`` expansions
    emptied (``${PASSWORD:?set it}`` names a variable, it holds no value)."""
    stripped = line.lstrip()
    if stripped.startswith(("#", "--")):
        return ""
    line = re.sub(r"(^|\s)#.*$", "", line)
    return re.sub(r"\$\{[^}]*\}", "${}", line)


def find_secrets(text: str, name: str = "<text>") -> list[str]:
    """Lines that look like committed secrets: a literal value given to a password / token /
    secret / key (outside comments), a private key, an AWS key id, a long hex token, a URL
    with user:password (anywhere, comments included)."""
    found = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for m in SECRET_ASSIGNMENT.finditer(_code_part(line)):
            value = m.group("value").strip()
            if not SAFE_VALUE.match(value) and not SAFE_VALUE.match(value.strip("'\"")):
                found.append(f"{name}:{lineno}: {m.group('key')} = {value!r}")
        for what, pattern in LEAK_PATTERNS.items():
            if pattern.search(line):
                found.append(f"{name}:{lineno}: {what}")
    return found


@pytest.mark.parametrize("text", [
    "password: hunter2",
    "  POSTGRES_PASSWORD=s3cr3t-value",
    'mlflow_password = "correct horse"',
    "export RAY_AUTH_TOKEN=" + "ab12" * 16,
    "uri: postgresql://mlflow:hunter2@db:5432/mlflow",
    "aws_access_key_id: AKIAABCDEFGHIJKLMNOP",
])
def test_secret_scanner_catches_literals(text):
    assert find_secrets(text), text


@pytest.mark.parametrize("text", [
    "MLFLOW_TRACKING_PASSWORD=",
    "secretKeyRef: {name: haepo-mlflow-db, key: password}",
    "password: ${POSTGRES_PASSWORD}",
    '"~/.ray/auth_token": "~/.ray/auth_token"',
    "export RAY_AUTH_TOKEN_PATH='$token_file'",
    "authOptions:\n  mode: token",
    "MLFLOW_AUTH_ADMIN_PASSWORD: YOUR_PASSWORD",
    "MLFLOW_TRACKING_PASSWORD=<admin password> python -c ...",
])
def test_secret_scanner_lets_references_pass(text):
    assert not find_secrets(text), text


def test_no_secrets_committed_under_cluster():
    found = []
    for path in sorted(CLUSTER.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            found.append(f"{path}: a binary file")
            continue
        found += find_secrets(text, str(path.relative_to(REPO)))
    assert not found, "possible secrets committed:\n" + "\n".join(found)


def test_filled_in_env_files_are_git_ignored():
    ignore = (CLUSTER / ".gitignore").read_text().split()
    assert "*.env" in ignore
    assert not list(CLUSTER.rglob("*.env")) or all(
        subprocess.run(["git", "check-ignore", "-q", str(p)], cwd=REPO).returncode == 0
        for p in CLUSTER.rglob("*.env")
    )


# --------------------------------------------------------------------------- local scripts


LOCAL_SCRIPTS = sorted((CLUSTER / "local").glob("*.sh"))


@pytest.mark.parametrize("script", LOCAL_SCRIPTS, ids=lambda p: p.name)
def test_local_script_is_strict_bash_and_kills_by_pid_only(script):
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "\nset -euo pipefail\n" in text
    assert os.access(script, os.X_OK), f"{script} is not executable"
    subprocess.run(["bash", "-n", str(script)], check=True)
    code = [line.split("#", 1)[0] for line in text.splitlines()]
    for forbidden in ("ray stop", "pkill", "killall", "kill 0", "kill -- -1"):
        assert not any(forbidden in line for line in code), f"{script.name}: {forbidden}"
    help_out = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=30)
    assert help_out.returncode == 0 and help_out.stdout.strip(), help_out.stderr


def test_local_start_rejects_a_long_state_dir(tmp_path):
    """Ray's unix sockets live below the state directory: a long one is refused up front."""
    long_dir = tmp_path / ("x" * 60)
    out = subprocess.run([str(CLUSTER / "local" / "start.sh"), "-d", str(long_dir), "--no-mlflow"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "longer than 40 characters" in out.stderr


def test_local_stop_without_a_cluster_is_a_no_op(tmp_path):
    out = subprocess.run([str(CLUSTER / "local" / "stop.sh"), "-d", str(tmp_path)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "nothing to stop" in out.stdout
