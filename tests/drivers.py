"""Sweep drivers for the tests that kill one: a `haepo sweep` process started in its own
process group, SIGKILLed at a chosen moment, the sweep resumed, and what MLflow then holds.
(test_sweep_e2e, test_llm_sweep and test_postgres use them.)"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import yaml
from helpers import sqlite_store
from mlflow.tracking import MlflowClient


def metric_rows(db: Path, key: str) -> int:
    """Rows of metric ``key`` in the SQLite store ``db`` (read-only; 0 while it is busy)."""
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            return conn.execute("select count(*) from metrics where key = ?", (key,)).fetchone()[0]
    except sqlite3.Error:
        return 0


def logged_rows(uri: str, experiment: str, roles: tuple[str, ...] = ("trial",)) -> Counter:
    """How often MLflow holds each (run, metric, step) of ``experiment``'s sweeps, for the runs
    of ``roles`` (``trial``: the children; ``sweep``: the parents): every row of every metric
    history, read through MLflow's client (any store)."""
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    rows: Counter = Counter()
    for role in roles:
        for run in client.search_runs([exp.experiment_id], f"tags.`haepo.role` = '{role}'"):
            for key in run.data.metrics:
                rows.update((run.info.run_id, key, m.step) for m in client.get_metric_history(run.info.run_id, key))
    return rows


def sweep_args(spec: Path, uri: str, results: Path, address: str, *extra: str) -> list[str]:
    """The arguments of `haepo sweep` for the killed-driver tests."""
    return ["sweep", str(spec), "--tracking-uri", uri, "--storage-path", str(results),
            "--address", address, "--quiet", *extra]


def killed_sweep(folder: Path, spec: dict, address: str) -> tuple[Path, str, Path, list[str]]:
    """Writes ``spec`` (named by its ``name``) into ``folder``; returns the sweep's SQLite store,
    its URI, its results folder and its `haepo sweep` arguments (:func:`sweep_args`)."""
    spec_path = folder / f"{spec['name']}.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    db = folder / "mlflow.db"
    uri = sqlite_store(db)
    results = folder / "results"
    return db, uri, results, sweep_args(spec_path, uri, results, address)


def start_driver(args: list[str], cwd: Path, log) -> subprocess.Popen:
    """`haepo ARGS` (a sweep's driver) in its own process group, its output to ``log``."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    env["PYTHONUNBUFFERED"] = "1"
    return subprocess.Popen([sys.executable, "-m", "haepo_ray.cli", *args], cwd=cwd, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def kill_driver_when(args: list[str], cwd: Path, ready, timeout_s: float = 180, paused: bool = False) -> None:
    """Runs `haepo ARGS` (the sweep's driver) in its own process group and SIGKILLs the group
    once ``ready()`` holds; fails if the driver ends first or ``ready`` never holds. With
    ``paused``, the group is stopped (SIGSTOP) while ``ready()`` looks, so that what it saw
    is what the kill leaves. Its output is in ``cwd/first.log``."""
    with open(cwd / "first.log", "w") as log:
        proc = start_driver(args, cwd, log)
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and proc.poll() is None:
                if paused:
                    os.killpg(proc.pid, signal.SIGSTOP)
                if ready():
                    break
                if paused:
                    os.killpg(proc.pid, signal.SIGCONT)
                time.sleep(0.05)
            assert proc.poll() is None, "the sweep ended before it could be killed:\n" + \
                (cwd / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the sweep did not get where it is killed in time"
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def resume_driver(args: list[str], monkeypatch, capfd) -> None:
    """`haepo ARGS --resume`, in this process (one process importing RLlib fewer)."""
    from haepo_ray.cli import main

    for key in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(key, raising=False)
    code = main([*args, "--resume"])
    second = capfd.readouterr()
    assert code == 0, second.out[-3000:] + second.err[-3000:]
    assert "(resuming)" in second.out
    assert "Restarting experiment" not in second.err, "Tune did not restore the run:\n" + second.err[-3000:]
    assert "Failed to fetch metrics" not in second.err  # the trials not started before the kill
