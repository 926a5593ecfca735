"""Ctrl-C on a sweep: Ray Tune saves its state and stops the running trials, marking them
TERMINATED as if they had finished. The sweep says it was interrupted (the summary, its JSON,
exit status 130), a stopped trial is INTERRUPTED there and its MLflow run KILLED, as is the
parent; ``--resume`` reopens them and finishes the sweep with each (run, metric, step) once.
SIGTERM (``haepo stop``, ``kill``, SLURM) does the same, with exit status 143, also where Ray's
own processes got it too and the sweep is ended without Ray.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from helpers import kill_tree, run_tree, sqlite_store
from mlflow.tracking import MlflowClient
from ray import tune
from test_sweep_resume import check_each_step_once, tiny

from haepo_ray.sweep.interrupt import SIGNALS, SIGTERM_GRACE_S, InterruptWatch
from haepo_ray.sweep.kinds import parse_plan
from haepo_ray.sweep.results import INTERRUPTED
from haepo_ray.sweep.runner import run_sweep
from haepo_ray.terminated import Terminated
from haepo_ray.tracking import find_sweep_runs

REPO = Path(__file__).resolve().parents[1]
ITERATIONS = 6


class CtrlC(tune.Callback):
    """Sends this process SIGINT, as a Ctrl-C would (or ``sig``), when trial ``index`` reports
    iteration ``at`` (Tune's driver loop runs callbacks in the main thread, which takes the signal)."""

    def __init__(self, index: int, at: int, sig: signal.Signals = signal.SIGINT):
        self.index, self.at, self.sig, self.sent = index, at, sig, False

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if not self.sent and trials.index(trial) == self.index and result["training_iteration"] == self.at:
            self.sent = True
            os.kill(os.getpid(), self.sig)


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
    assert "sweep interrupted (SIGINT): 1 trials finished, 1 stopped while running; results in " in text
    assert "the same command with --resume continues the sweep" in text and "sweep finished" not in text
    summary = json.loads((Path(first.run_dir) / "haepo_summary.json").read_text())
    assert summary["interrupted"] is True and summary["interrupted_by"] == "SIGINT"
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


class SignalAt(io.StringIO):
    """A sweep's output that sends this process ``sig`` when a line starting with ``line`` is
    written (by the main thread, whose handler of the signal then runs at once)."""

    def __init__(self, line: str, sig: signal.Signals = signal.SIGTERM):
        super().__init__()
        self.line, self.sig, self.sent = line, sig, False

    def write(self, text: str) -> int:
        written = super().write(text)
        if not self.sent and text.startswith(self.line):
            self.sent = True
            os.kill(os.getpid(), self.sig)
        return written


@pytest.mark.parametrize("line", ["MLflow parent run: ", "Ray Tune results: "])
def test_a_sigterm_before_tune_takes_it_ends_the_parent_run_killed(ray_session, tmp_path, monkeypatch, line):
    """Between Ray's start and Tune's fit, SIGTERM went to Ray's handler (here a recorder), which
    aborts the driver and leaves the parent run RUNNING: it raises Terminated instead, the parent
    ends KILLED, and the handler found is back."""
    monkeypatch.chdir(tmp_path)
    uri = sqlite_store(tmp_path / "mlflow.db")
    got: list[int] = []
    found = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    recorder = signal.getsignal(signal.SIGTERM)
    try:
        out = SignalAt(line)
        with pytest.raises(Terminated):
            run_sweep(parse_plan(tiny("early", 2), "early.yaml"), tracking_uri=uri,
                      storage_path=str(tmp_path / "results"), out=out, verbose=0)
        assert out.sent and got == [], "Ray's handler got the SIGTERM"
        assert signal.getsignal(signal.SIGTERM) is recorder, "the handler found is not back"
    finally:
        signal.signal(signal.SIGTERM, found)
    assert statuses(uri, "early")[0] == "KILLED"


class SlowEnd(tune.Callback):
    """An end that takes ``seconds`` (as MLflow's flush of a backlog may)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_experiment_end(self, trials, **info):
        time.sleep(self.seconds)


def test_sigterm_stops_the_sweep_as_ctrl_c_does(ray_session, tmp_path, monkeypatch):
    """SIGTERM (haepo stop, kill) goes to Tune's handler: Tune's stop, said as SIGTERM, and the
    SIGTERM handler found before the sweep is back after it. The grace covers Tune's stop of
    the trials, not the callbacks' ends after it: a slow one is not cut short (which would end
    this process, 143)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HAEPO_SIGTERM_GRACE_S", "8")  # Tune stops the trial in 0.6 s (idle)
    uri = sqlite_store(tmp_path / "mlflow.db")
    found = []

    def ray_handler(signum, frame):
        found.append(signum)

    previous = signal.signal(signal.SIGTERM, ray_handler)
    try:
        term = CtrlC(index=0, at=2, sig=signal.SIGTERM)
        result = run_sweep(parse_plan(tiny("term", ITERATIONS), "term.yaml"), tracking_uri=uri,
                           storage_path=str(tmp_path / "results"), out=io.StringIO(), verbose=0,
                           extra_callbacks=[term, SlowEnd(10.0)])
        assert term.sent and found == [], "the watch took the SIGTERM"
        assert signal.getsignal(signal.SIGTERM) is ray_handler, "the handler found before the sweep is back"
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert (result.interrupted, result.interrupted_by) == (True, "SIGTERM")
    assert [(t.status, t.iterations) for t in result.trials] == [(INTERRUPTED, 2)]
    assert statuses(uri, "term") == ("KILLED", {result.trials[0].trial_id: "KILLED"})


class _Trial:
    def __init__(self, trial_id: str, status: str):
        self.trial_id, self.status = trial_id, status


@pytest.fixture
def tune_handlers():
    """What ``tune.run`` installs before the callbacks' ``setup`` (here a recorder of the signals
    it gets), and a SIGTERM handler of Ray's (a recorder too); all put back after the test."""
    before = {sig: signal.getsignal(sig) for sig in SIGNALS}
    got: dict[str, list[int]] = {"tune": [], "ray": []}
    for sig in (signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, lambda signum, frame: got["tune"].append(signum))
    signal.signal(signal.SIGTERM, lambda signum, frame: got["ray"].append(signum))
    yield got
    for sig, handler in before.items():
        signal.signal(sig, handler)


def _grace_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "haepo-sigterm-grace"]


def test_a_sweep_still_running_after_the_grace_of_a_sigterm_is_handed_to_on_stuck(tune_handlers):
    """Where Ray's own processes got the SIGTERM too, Tune cannot stop the trials: the watch
    hands the trials to ``on_stuck`` ``grace_s`` after the signal; a second SIGTERM is Ray's."""
    stuck: list[list] = []
    handed = threading.Event()
    watch = InterruptWatch(on_stuck=lambda trials: (stuck.append(trials), handed.set()), grace_s=0.3)
    watch.setup()
    trials = [_Trial("a", "RUNNING"), _Trial("b", "TERMINATED")]
    watch.on_step_begin(0, trials)
    os.kill(os.getpid(), signal.SIGTERM)
    assert (watch.signal, watch.statuses) == ("SIGTERM", {"a": "RUNNING", "b": "TERMINATED"})
    assert tune_handlers == {"tune": [signal.SIGUSR1], "ray": []}, "Tune's stop, through its handler"
    os.kill(os.getpid(), signal.SIGTERM)
    assert tune_handlers["ray"] == [signal.SIGTERM], "a second SIGTERM is not Tune's"
    assert handed.wait(10) and stuck == [trials]
    watch.release()


def test_a_sweep_that_ends_within_the_grace_is_not_handed_on(tune_handlers):
    stuck: list[list] = []
    watch = InterruptWatch(on_stuck=stuck.append, grace_s=0.3)
    watch.setup()
    watch.on_step_begin(0, [_Trial("a", "RUNNING")])
    os.kill(os.getpid(), signal.SIGTERM)
    watch.on_experiment_end([])  # Tune stopped the trials and returned
    deadline = time.monotonic() + 10
    while _grace_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _grace_threads() and stuck == []
    assert all(signal.getsignal(sig) != watch._on_signal for sig in SIGNALS), "handlers put back"


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
    assert "sweep interrupted (SIGINT): 0 trials finished, 1 stopped while running" in first, first[-3000:]
    assert statuses(uri, "cli-ctrl-c")[0] == "KILLED"

    resumed = run_tree(command + ["--resume"], cwd=tmp_path, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "sweep finished: 2 trials" in resumed.stdout
    parent, children = statuses(uri, "cli-ctrl-c")
    assert parent == "FINISHED" and sorted(children.values()) == ["FINISHED"] * 2
    check_each_step_once(uri, "cli-ctrl-c", 40, trials=2)


@pytest.mark.slow
def test_sigterm_on_haepo_sweep_before_tune_exits_143_with_its_parent_run_killed(tmp_path):
    """With Ray's own handlers: SIGTERM once the driver has its parent run, before Tune's fit,
    ends it with exit 143 and the parent KILLED (Ray's C++ handler aborted it, SIGABRT, with
    the parent RUNNING)."""
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(tiny("cli-early", 2)))
    uri = sqlite_store(tmp_path / "mlflow.db")
    command = [sys.executable, "-m", "haepo_ray.cli", "sweep", "spec.yaml", "--quiet", "--tracking-uri", uri,
               "--storage-path", str(tmp_path / "results")]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
    log_path = tmp_path / "first.log"
    with open(log_path, "w") as log:
        driver = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while "MLflow parent run: " not in log_path.read_text():
                assert driver.poll() is None and time.monotonic() < deadline, "no parent run"
                time.sleep(0.01)
            driver.send_signal(signal.SIGTERM)
            code = driver.wait(timeout=120)
        finally:
            kill_tree(driver.pid)
    first = log_path.read_text()
    assert code == 143 and "interrupted before Ray Tune saved the sweep's state" in first, (code, first[-3000:])
    assert statuses(uri, "cli-early")[0] == "KILLED"


def _checkpoints(folder: Path) -> set[Path]:
    return set(folder.rglob("checkpoint_0*"))


@pytest.mark.slow
def test_sigterm_on_haepo_sweep_exits_143_with_or_without_ray_and_resume_finishes(tmp_path):
    """SIGTERM to the whole process group (SLURM's scancel; the embedded Ray's processes die
    with it): the sweep is ended without Ray after the grace, its runs KILLED, exit 143. Then
    SIGTERM to the driver alone (haepo stop, kill): Tune's own stop, exit 143. A resume
    finishes the sweep with each (run, metric, step) once."""
    spec = tiny("cli-term", 40, search_space={"seed": {"grid": [0, 1]}}, max_concurrent_trials=1)
    spec["settings"]["min_time_s_per_iteration"] = 0.2
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    uri = sqlite_store(tmp_path / "mlflow.db")
    results = tmp_path / "results"
    command = [sys.executable, "-m", "haepo_ray.cli", "sweep", "spec.yaml", "--quiet", "--tracking-uri", uri,
               "--storage-path", str(results)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"}

    def terminate(args: list[str], log_name: str, whole_group: bool) -> tuple[str, float]:
        before = _checkpoints(results)
        with open(tmp_path / log_name, "w") as log:
            driver = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
            try:
                deadline = time.monotonic() + 240
                while len(_checkpoints(results) - before) < 2:
                    assert driver.poll() is None and time.monotonic() < deadline, "no two new checkpoints"
                    time.sleep(0.2)
                sent = time.monotonic()
                if whole_group:
                    os.killpg(driver.pid, signal.SIGTERM)
                else:
                    driver.send_signal(signal.SIGTERM)
                assert driver.wait(timeout=120) == 143
                seconds = time.monotonic() - sent
            finally:
                kill_tree(driver.pid)
        return (tmp_path / log_name).read_text(), seconds

    first, seconds = terminate(command, "first.log", whole_group=True)
    print(f"SIGTERM to the process group: ended in {seconds:.1f} s")
    assert "Ray's own processes got the SIGTERM too: the sweep is ended without them\n" \
           "sweep interrupted (SIGTERM): 0 trials finished, 1 stopped while running" in first, first[-3000:]
    (run_dir,) = results.glob("cli-term/*")
    summary = json.loads((run_dir / "haepo_summary.json").read_text())
    assert (summary["interrupted_by"], [t["status"] for t in summary["trials"]]) == ("SIGTERM", [INTERRUPTED])
    assert SIGTERM_GRACE_S <= seconds < SIGTERM_GRACE_S + 30
    parent, children = statuses(uri, "cli-term")
    assert parent == "KILLED" and list(children.values()) == ["KILLED"]

    second, seconds = terminate(command + ["--resume"], "second.log", whole_group=False)
    print(f"SIGTERM to the driver: ended in {seconds:.1f} s")
    assert "sweep interrupted (SIGTERM): " in second and "without them" not in second, second[-3000:]
    parent, children = statuses(uri, "cli-term")
    assert parent == "KILLED" and "KILLED" in children.values() and "RUNNING" not in children.values()

    resumed = run_tree(command + ["--resume"], cwd=tmp_path, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    check_each_step_once(uri, "cli-term", 40, trials=2)
