"""Ctrl-C on a sweep: Ray Tune saves its state and stops the running trials, marking them
TERMINATED as if they had finished. The sweep says it was interrupted (the summary, its JSON,
exit status 130), a stopped trial is INTERRUPTED there and its MLflow run KILLED, as is the
parent; ``--resume`` reopens them and finishes the sweep with each (run, metric, step) once.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import kill_tree, run_tree, sqlite_store
from mlflow.tracking import MlflowClient
from ray import tune
from test_sweep_resume import check_each_step_once, tiny

from haepo_ray.sweep.interrupt import SIGNALS, InterruptWatch
from haepo_ray.sweep.kinds import parse_plan
from haepo_ray.sweep.results import INTERRUPTED
from haepo_ray.sweep.runner import run_sweep
from haepo_ray.tracking import find_sweep_runs

REPO = Path(__file__).resolve().parents[1]
ITERATIONS = 6


class CtrlC(tune.Callback):
    """Sends this process SIGINT, as a Ctrl-C would, when trial ``index`` reports iteration ``at``
    (Tune's driver loop runs callbacks in the main thread, which takes the signal)."""

    def __init__(self, index: int, at: int):
        self.index, self.at, self.sent = index, at, False

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if not self.sent and trials.index(trial) == self.index and result["training_iteration"] == self.at:
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)


def statuses(uri: str, experiment: str) -> tuple[str, dict[str, str]]:
    """The parent run's status, and each child's by its trial id."""
    parent, children = find_sweep_runs(uri, experiment)
    return parent.info.status, {c.data.tags["haepo.trial_id"]: c.info.status for c in children}


def test_ctrl_c_stops_the_sweep_says_so_and_a_resume_finishes_it(ray_session, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = parse_plan(tiny("ctrl-c", ITERATIONS, search_space={"seed": {"grid": [0, 1, 2]}},
                           max_concurrent_trials=1), "ctrl-c.yaml")
    uri = sqlite_store(tmp_path / "mlflow.db")
    results = str(tmp_path / "results")
    out = io.StringIO()
    ctrl_c = CtrlC(index=1, at=3)
    first = run_sweep(plan, tracking_uri=uri, storage_path=results, out=out, verbose=0, extra_callbacks=[ctrl_c])

    assert ctrl_c.sent and first.interrupted
    done, stopped = first.trials[0], first.trials[1]
    assert (done.status, done.iterations) == ("TERMINATED", ITERATIONS)
    assert (stopped.status, stopped.iterations) == (INTERRUPTED, 3)
    assert [t.status for t in first.trials[2:]] in ([], ["PENDING"])  # Tune makes trials as slots free up
    text = out.getvalue()
    assert "sweep interrupted: 1 trials finished, 1 stopped while running; results in " in text
    assert "the same command with --resume continues the sweep" in text and "sweep finished" not in text
    summary = json.loads((Path(first.run_dir) / "haepo_summary.json").read_text())
    assert summary["interrupted"] is True
    assert {t["trial_id"]: t["status"] for t in summary["trials"]} == {t.trial_id: t.status for t in first.trials}
    assert statuses(uri, "ctrl-c") == ("KILLED", {done.trial_id: "FINISHED", stopped.trial_id: "KILLED"})
    # Tune's handlers are put back, without the watch around them
    assert not any(isinstance(getattr(h, "__self__", None), InterruptWatch)
                   for h in map(signal.getsignal, SIGNALS))

    second = run_sweep(plan, tracking_uri=uri, storage_path=results, out=io.StringIO(), verbose=0, resume=True)
    assert not second.interrupted
    assert [(t.status, t.iterations) for t in second.trials] == [("TERMINATED", ITERATIONS)] * 3
    (restored,) = [r.metrics for r in second.result_grid if r.metrics["trial_id"] == stopped.trial_id]
    # from a checkpoint (Tune registers the one of the result the Ctrl-C came at after its callbacks)
    assert 0 < restored["training_iteration"] - restored["iterations_since_restore"] <= 3
    parent, children = statuses(uri, "ctrl-c")
    assert parent == "FINISHED" and sorted(children.values()) == ["FINISHED"] * 3
    check_each_step_once(uri, "ctrl-c", ITERATIONS, trials=3)


def test_a_sweep_that_was_not_interrupted_says_it_finished(ray_session, tmp_path, monkeypatch):
    """The watch records nothing without a signal, and the parent run ends FINISHED."""
    monkeypatch.chdir(tmp_path)
    uri = sqlite_store(tmp_path / "mlflow.db")
    result = run_sweep(parse_plan(tiny("whole", 2), "whole.yaml"), tracking_uri=uri,
                       storage_path=str(tmp_path / "results"), out=io.StringIO(), verbose=0)
    assert not result.interrupted and [t.status for t in result.trials] == ["TERMINATED"]
    assert statuses(uri, "whole")[0] == "FINISHED"


@pytest.mark.slow
def test_ctrl_c_on_haepo_sweep_exits_130_and_resume_exits_0(tmp_path):
    """The command line, from a terminal's Ctrl-C (SIGINT to the driver) to its resume."""
    spec = tiny("cli-ctrl-c", 40, search_space={"seed": {"grid": [0, 1]}}, max_concurrent_trials=1)
    spec["settings"]["min_time_s_per_iteration"] = 0.2
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    uri = sqlite_store(tmp_path / "mlflow.db")
    command = [sys.executable, "-m", "haepo_ray.cli", "sweep", "spec.yaml", "--quiet", "--tracking-uri", uri,
               "--storage-path", str(tmp_path / "results")]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"}
    with open(tmp_path / "first.log", "w") as log:
        driver = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 240
            while not list((tmp_path / "results").rglob("checkpoint_000002")):
                assert driver.poll() is None and time.monotonic() < deadline, "no third checkpoint"
                time.sleep(0.2)
            driver.send_signal(signal.SIGINT)
            assert driver.wait(timeout=120) == 130
        finally:
            kill_tree(driver.pid)  # nothing left running where the test failed
    first = (tmp_path / "first.log").read_text()
    assert "sweep interrupted: 0 trials finished, 1 stopped while running" in first, first[-3000:]
    assert statuses(uri, "cli-ctrl-c")[0] == "KILLED"

    resumed = run_tree(command + ["--resume"], cwd=tmp_path, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "sweep finished: 2 trials" in resumed.stdout
    parent, children = statuses(uri, "cli-ctrl-c")
    assert parent == "FINISHED" and sorted(children.values()) == ["FINISHED"] * 2
    check_each_step_once(uri, "cli-ctrl-c", 40, trials=2)
