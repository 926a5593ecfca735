"""Another Ray version, as ``haepo sweep`` meets it: Ray's own ``ray.__version__`` is set in the
command's process (a ``-c`` wrapper around the command line; nothing else changes), and the
sweep refuses before it writes anything (no MLflow run, no run folder), in ``--dry-run`` too,
with exit status 2 and one paragraph; ``HAEPO_PATCHES=untested`` runs it with a warning in the
log and a tag on the MLflow parent run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import SMOKE, sqlite_store
from mlflow.tracking import MlflowClient

from haepo_ray import names

# The haepo command line, in a process whose Ray says it is the version given first.
AS_VERSION = ("import sys, ray; ray.__version__ = sys.argv.pop(1); "
              "from haepo_ray.cli import main; sys.exit(main(sys.argv[1:]))")


def haepo_as(version: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", AS_VERSION, version, *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env})


def one_trial_spec(path: Path) -> Path:
    spec = yaml.safe_load(SMOKE.read_text())
    spec["search_space"] = {"lr": {"grid": [0.05]}}
    spec["stop"] = {"iterations": 1}
    spec["ray"] = {"num_cpus": 1}
    path.write_text(yaml.safe_dump(spec))
    return path


def test_another_ray_is_refused_before_anything_is_written(tmp_path):
    uri = sqlite_store(tmp_path / "mlflow.db")
    spec = one_trial_spec(tmp_path / "one.yaml")
    results = tmp_path / "results"
    common = [str(spec), "--tracking-uri", uri, "--storage-path", str(results)]
    env = {"HAEPO_PATCHES": "all"}

    dry = haepo_as("2.61.0", "sweep", *common, "--dry-run", **env)
    run = haepo_as("2.61.0", "sweep", *common, **env)

    for out in (dry, run):
        assert out.returncode == 2, out.stderr[-3000:]
        assert "Traceback" not in out.stderr
        (line,) = out.stderr.strip().splitlines()  # one paragraph
        assert line.startswith("haepo sweep: error: haepo-ray's patches 'keep launching actors', ")
        assert "were written and tested for ray 2.60.0, and ray 2.61.0 is installed." in line
        assert "'connectors built without reading source files'" in line  # the trials' patch too
        assert "The internals they rely on are unchanged in ray 2.61.0." in line
        assert "set HAEPO_PATCHES=untested to run them untested" in line
    assert "MLflow" not in run.stdout and "Ray Tune results" not in run.stdout
    assert not results.exists()
    assert MlflowClient(uri).search_runs([e.experiment_id for e in MlflowClient(uri).search_experiments()]) == []


# Slow tier (a real sweep, about 20 s): test_upstream_patches proves the setting in the test command.
@pytest.mark.slow
def test_the_untested_setting_runs_the_sweep_with_a_warning_and_a_tag(tmp_path):
    uri = sqlite_store(tmp_path / "mlflow.db")
    spec = one_trial_spec(tmp_path / "one.yaml")
    args = [str(spec), "--tracking-uri", uri, "--storage-path", str(tmp_path / "results"), "--quiet"]

    dry = haepo_as("2.61.0", "sweep", *args, "--dry-run", HAEPO_PATCHES="untested")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "HAEPO_PATCHES=untested: haepo-ray's patches 'keep launching actors'" in dry.stdout
    out = haepo_as("2.61.0", "sweep", *args, HAEPO_PATCHES="untested")
    assert out.returncode == 0, out.stderr[-3000:]
    warning = "run on ray 2.61.0, untested (tested: ray 2.60.0); the internals they rely on are unchanged"
    assert "WARNING haepo_ray.upstream: HAEPO_PATCHES=untested: haepo-ray's patches" in out.stderr
    assert warning in out.stderr
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("smoke").experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get(names.ROLE) == "sweep"]
    assert warning in parent.data.tags[names.UNTESTED_UPSTREAM]
    assert parent.data.tags[names.CODE_PATCHES] == "untested"
    assert {r.info.status for r in runs} == {"FINISHED"} and len(runs) == 2


def test_a_sweep_on_a_cluster_gives_its_actors_the_patch_setting(monkeypatch):
    """Through ``ray.init``'s runtime environment, unless a submitted job's runtime environment
    sets it already (Ray's job manager hands the job's config to its driver in this variable;
    Ray refuses a variable that both set). The 3-node cluster's submit test sees it arrive."""
    from haepo_ray.sweep.runner import actor_env_vars

    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    monkeypatch.delenv("HAEPO_PATCHES", raising=False)
    assert actor_env_vars() == {}
    monkeypatch.setenv("HAEPO_PATCHES", "untested")
    assert actor_env_vars() == {"HAEPO_PATCHES": "untested"}
    job = {"runtime_env": {"env_vars": {"HAEPO_PATCHES": "untested"}}, "metadata": {}}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(job))
    assert actor_env_vars() == {}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {}, "metadata": {}}))
    assert actor_env_vars() == {"HAEPO_PATCHES": "untested"}
