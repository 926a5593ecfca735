"""Provenance: the tags that say which code, machine and libraries made a run
(haepo_ray.provenance), the report's table of them per configuration, its flag on an
experiment that mixes code versions, and bench/reproduce.sh's refusal of runs made by another
commit than its checkout's. (That every sweep run carries the tags is checked by the sweep
tests: sweep_checks.check_provenance.)
"""

from __future__ import annotations

import html
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import sqlite_store

from haepo_ray import cli, names
from haepo_ray.provenance import changed_files, changed_paths, provenance
from haepo_ray.report import build_report

REPO = Path(__file__).resolve().parents[1]
OTHER = "0123456789abcdef0123456789abcdef01234567"  # a commit that made no run here


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_this_process_knows_its_commit_machine_and_libraries():
    import importlib.metadata

    import psutil
    import ray

    tags = provenance()
    assert tags[names.CODE_COMMIT] == git("rev-parse", "HEAD")
    changed = git("diff", "--name-only", "HEAD").splitlines()
    changed += git("ls-files", "--others", "--exclude-standard", "--full-name", "haepo_ray").splitlines()
    tracked_or_new = git("status", "--porcelain", "--untracked-files=no") or git("status", "--porcelain", "haepo_ray")
    assert tags[names.CODE_DIRTY] == str(bool(tracked_or_new)).lower()
    assert tags.get(names.CODE_CHANGED) == (changed_files(changed) if tags[names.CODE_DIRTY] == "true" else None)
    assert tags[names.CODE_VERSION] == importlib.metadata.version("haepo-ray")
    assert tags[names.MACHINE_CPUS] == str(os.cpu_count())
    assert float(tags[names.MACHINE_MEMORY_GB]) == pytest.approx(psutil.virtual_memory().total / 2**30, abs=0.1)
    assert tags[names.VERSION_RAY] == tags[names.VERSION_RLLIB] == ray.__version__
    assert tags[names.VERSION_TORCH] == importlib.metadata.version("torch")


def test_outside_a_git_checkout_the_package_version_stands_alone(tmp_path):
    """A copy of the package outside any git checkout (as a wheel or a Ray runtime
    environment installs it) records the installed version and no commit."""
    shutil.copytree(REPO / "haepo_ray", tmp_path / "haepo_ray", ignore=shutil.ignore_patterns("__pycache__"))
    code = "import json, haepo_ray.provenance as p; print(json.dumps(p.code_version()))"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(tmp_path)}).stdout
    assert json.loads(out) == {names.CODE_VERSION: "0.1.0"}


def test_a_dirty_checkout_names_the_tracked_files_that_differ(tmp_path):
    """A checkout of the package with an edited tracked note, a staged edit and an untracked
    file: dirty, and the two tracked files named from the checkout's root; a new module in the
    package (untracked) named too, an ignored one not. 25 changed files name 20, then how many
    more."""
    shutil.copytree(REPO / "haepo_ray", tmp_path / "haepo_ray", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "notes.md").write_text("v1\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("v1\n")

    def run(*args: str) -> str:
        return subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, check=True).stdout

    run("git", "init", "-q")
    run("git", "add", ".")
    run("git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    code = "import json, haepo_ray.provenance as p; print(json.dumps(p.code_version()))"
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}

    def tags() -> dict:
        return json.loads(subprocess.run([sys.executable, "-c", code], cwd=tmp_path / "haepo_ray", env=env,
                                         capture_output=True, text=True, check=True).stdout)

    assert tags()[names.CODE_DIRTY] == "false" and names.CODE_CHANGED not in tags()
    (tmp_path / "notes.md").write_text("v2\n")
    (tmp_path / "docs" / "a.md").write_text("v2\n")
    run("git", "add", "docs/a.md")
    (tmp_path / "untracked.md").write_text("not tracked\n")
    assert (tags()[names.CODE_DIRTY], tags()[names.CODE_CHANGED]) == ("true", "docs/a.md, notes.md")
    run("git", "checkout", "-q", "HEAD", "--", ".")  # tracked files clean again; new ones at the root stay unnamed
    (tmp_path / "haepo_ray" / "extra.py").write_text("X = 1\n")
    (tmp_path / ".gitignore").write_text("ignored.py\n")
    (tmp_path / "haepo_ray" / "ignored.py").write_text("Y = 1\n")
    assert (tags()[names.CODE_DIRTY], tags()[names.CODE_CHANGED]) == ("true", "haepo_ray/extra.py")
    many = changed_files(f"f{i:02d}.py" for i in range(25))
    assert many.endswith("f19.py, +5 more") and changed_paths(many) == [f"f{i:02d}.py" for i in range(20)]


def _store(root: Path, commits: list[str], experiment: str = "prov", dirty: str = "false",
           changed: str | None = None) -> str:
    """A store of one finished trial per commit (seeds 0, 1, ...), one configuration."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    uri = sqlite_store(root / "mlflow.db")
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp else client.create_experiment(
        experiment, artifact_location=(root / "artifacts").as_uri())
    parent = client.create_run(exp_id, tags={"haepo.role": "sweep"}).info.run_id
    for seed, commit in enumerate(commits):
        tags = {"mlflow.parentRunId": parent, "haepo.role": "trial", "haepo.algorithm": "HAEPO",
                "haepo.env": "haepo/ChainMDP-v0", "haepo.search_values": json.dumps({"lr": 0.1, "seed": seed}),
                **provenance(), names.CODE_COMMIT: commit, names.CODE_DIRTY: dirty}
        tags.pop(names.CODE_CHANGED, None)
        if changed:
            tags[names.CODE_CHANGED] = changed
        run = client.create_run(exp_id, tags=tags).info.run_id
        client.log_batch(run, metrics=[Metric(names.EPISODE_RETURN_MEAN, 1.0, 0, 1),
                                       Metric(names.TIME_TOTAL_S, 1.0, 0, 1)])
        client.set_terminated(run)
    return uri


def test_the_report_shows_provenance_per_configuration_and_flags_mixed_code(tmp_path, capsys):
    head = git("rev-parse", "HEAD")
    uri = _store(tmp_path, [head, head, OTHER])
    assert cli.main(["report", "--tracking-uri", uri, "--experiment", "prov", "--out", str(tmp_path / "r")]) == 0
    printed = capsys.readouterr()
    warning = f"experiment 'prov' mixes code versions: {head[:12]} (2 runs); {OTHER[:12]} (1 runs)"
    assert f"WARNING: {warning}" in printed.out and f"WARNING: {warning}" in printed.err
    assert warning in (tmp_path / "r" / "results.md").read_text()
    assert html.escape(warning) in (tmp_path / "r" / "index.html").read_text()
    report = build_report(uri, ["prov"], tmp_path / "r")
    (row,) = report.provenance.to_dict("records")
    machine = provenance()
    assert row["code"] == f"{head[:12]} (2 runs); {OTHER[:12]} (1 runs)"
    assert row["machine"].startswith(f"{machine[names.MACHINE_CPUS]} CPUs")
    assert (row["ray"], row["torch"]) == (machine[names.VERSION_RAY], machine[names.VERSION_TORCH])
    assert "Provenance (code, machine, libraries):" in printed.out


def test_a_report_refuses_runs_of_another_commit_than_required(tmp_path, capsys):
    head = git("rev-parse", "HEAD")
    uri = _store(tmp_path, [head, OTHER])
    assert cli.main(["report", "--tracking-uri", uri, "--experiment", "prov", "--out", str(tmp_path / "r"),
                     "--require-commit", head]) == 2
    err = capsys.readouterr().err
    assert f"1 of 2 runs were not made by commit {head[:12]}: {OTHER[:12]}" in err
    assert not (tmp_path / "r").exists(), "a refused report wrote files"
    assert cli.main(["report", "--tracking-uri", uri, "--experiment", "prov", "--out", str(tmp_path / "r"),
                     "--require-commit", "HEAD"]) == 2
    assert "a required commit is a git hash of 7 to 40 hex digits, got 'HEAD'" in capsys.readouterr().err

    (tmp_path / "dirty").mkdir()
    dirty = _store(tmp_path / "dirty", [head], dirty="true")
    report = build_report(dirty, ["prov"], tmp_path / "d", require_commit=head[:7])
    assert report.warnings == [f"1 of 1 runs were made from commit {head[:7]} with uncommitted changes: "
                               "what they ran may not be that commit"]
    (tmp_path / "noted").mkdir()
    noted = _store(tmp_path / "noted", [head, head], dirty="true", changed="REPRODUCTION.md, bench/x.md")
    report = build_report(noted, ["prov"], tmp_path / "n", require_commit=head[:7])
    assert report.warnings == [f"2 of 2 runs were made from commit {head[:7]} with uncommitted changes (to "
                               "REPRODUCTION.md, bench/x.md): what they ran may not be that commit"]


def test_reproduce_sh_refuses_runs_made_by_another_commit(tmp_path):
    """bench/reproduce.sh reports what its store holds (REPORT_ONLY: no sweeps here): runs of
    its checkout's commit pass, a run of another commit makes it refuse (exit 1)."""
    head = git("rev-parse", "HEAD")
    _store(tmp_path, [head], experiment="chain_mdp_haepo")
    env = {**os.environ, "REPRO_DIR": str(tmp_path), "REPORT_ONLY": "1",
           "HAEPO": str(Path(sys.executable).with_name("haepo"))}
    env.pop("MLFLOW_TRACKING_URI", None)

    def reproduce() -> subprocess.CompletedProcess:
        return subprocess.run([str(REPO / "bench" / "reproduce.sh"), "chain_mdp"], env=env, capture_output=True,
                              text=True, timeout=300)

    typo = subprocess.run([str(REPO / "bench" / "reproduce.sh"), "chain_mdp", "chain_mpd"], capture_output=True,
                          text=True, timeout=60, env={**env, "REPORT_ONLY": "", "HAEPO": "/nonexistent/haepo"})
    assert (typo.returncode, typo.stdout) == (2, ""), typo.stdout  # chain_mdp's sweeps ran before
    assert typo.stderr.endswith("no specs tune_configs/paper/chain_mpd_*.yaml: nothing run\n"), typo.stderr
    first = reproduce()
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert (tmp_path / "report-chain_mdp" / "provenance.csv").read_text().count(head[:12]) == 1
    _store(tmp_path, [OTHER], experiment="chain_mdp_haepo")
    second = reproduce()
    assert second.returncode == 1
    assert f"1 of 2 runs were not made by commit {head[:12]}: {OTHER[:12]}" in second.stderr
