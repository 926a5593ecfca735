"""A resumed sweep whose killed driver's MLflow writer was behind (issue 44): every row Tune
wrote to a trial's ``result.json`` reaches MLflow exactly once, whichever metric, whether or not
the trial had an MLflow run, and whatever the tracking server did meanwhile:

- a driver that had logged no run of its trial stops past the trial's checkpoint, and the
  resume restores the trial from it (fast);
- the same, stopped before the trial's first checkpoint: the resume restarts it from scratch,
  and its run keeps the killed attempt's rows (slow);
- the repro: the server killed once the parent run exists, the driver killed once both trials
  are past a checkpoint with no child run in MLflow, the server back, ``--resume`` (slow);
- a trial actor killed while the server is down (slow);
- the server down at the moment a trial starts (slow);
- the driver killed during the final flush, the sweep's trials all ended (slow).
"""

from __future__ import annotations

import io
import json
import os
import signal
import sqlite3
import time
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from drivers import kill_driver_when, resume_driver, sweep_args
from helpers import LOGGED, MLflowServer, sqlite_store
from mlflow.tracking import MlflowClient
from ray import tune
from test_tracking_callback import ServerOutage

from haepo_ray.sweep.kinds import parse_plan
from haepo_ray.sweep.runner import run_sweep
from haepo_ray.tracking.audit import audit_sweep, rows_on_disk


def spec(name: str, iterations: int, seeds=(0, 1), **overrides) -> dict:
    """HAEPO on a 3-state chain, one trial per seed, both at once, checkpointed every 3
    iterations, logging :data:`helpers.LOGGED` (the learner's metrics among them)."""
    return {"name": name, "algorithm": "HAEPO", "env": "haepo/ChainMDP-v0", "env_config": {"length": 3, "horizon": 5},
            "settings": {"num_env_runners": 0, "batch_size": 4, "model_config": {"fcnet_hiddens": [8]}},
            "search": {"algorithm": "grid"}, "search_space": {"seed": {"grid": list(seeds)}},
            "stop": {"iterations": iterations}, "max_concurrent_trials": 2, "reuse_actors": False,
            "max_failures": 0, "checkpoint_frequency": 3, "checkpoint_at_end": True,
            "tracking": {"metrics": LOGGED, "log_checkpoints": False}, **overrides}


def check_every_row_once(uri: str, experiment: str, run_dir: Path, iterations: int) -> None:
    """One parent, FINISHED; one FINISHED run per trial of ``run_dir``, holding each (metric,
    step) of its ``result.json`` once and nothing else (:func:`audit_sweep`); every trial ran
    ``iterations``, and its rows on disk hold each of those steps."""
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    (parent,) = client.search_runs([exp.experiment_id], "tags.`haepo.role` = 'sweep'")
    audit = audit_sweep(client, exp.experiment_id, parent.info.run_id, run_dir, LOGGED)
    assert audit.ok and not audit.extra, audit.summary()
    summary = json.loads((run_dir / "haepo_summary.json").read_text())
    assert [(t["status"], t["iterations"]) for t in summary["trials"]] == [("TERMINATED", iterations)] * len(audit.runs)
    for rows in rows_on_disk(run_dir, LOGGED).values():
        assert {step for _, step in rows} == set(range(1, iterations + 1))


def restored_from_checkpoint(run_dir: Path) -> list[bool]:
    """Per trial: its last result came after a restore from a checkpoint (not from scratch)."""
    last = [json.loads(p.read_text().splitlines()[-1]) for p in sorted(run_dir.glob("*/result.json"))]
    return [0 < r["iterations_since_restore"] < r["training_iteration"] for r in last]


class DriverCrash(Exception):
    pass


class CrashBetween(tune.Callback):
    """Raises out of Tune's loop (a driver's crash: Tune stops where it is, its trials RUNNING in
    its state) once the state on storage has every one of ``trials`` trials at an iteration
    strictly between ``low`` and ``high``."""

    def __init__(self, results: Path, experiment: str, trials: int, low: int, high: int):
        self.results, self.experiment, self.trials, self.low, self.high = results, experiment, trials, low, high

    def on_step_begin(self, iteration, trials, **info):
        seen = state_iterations(self.results, self.experiment)
        if len(seen) == self.trials and all(self.low < it < self.high for it in seen.values()):
            raise DriverCrash(seen)


def crashed_untracked(tmp_path: Path, monkeypatch, name: str, low: int, high: int):
    """A one-trial sweep of 8 iterations (a checkpoint every 3) that logs nothing to MLflow, as
    a killed driver whose writer had created no run, crashed at an iteration between ``low`` and
    ``high``: its plan, results folder and run folder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TUNE_GLOBAL_CHECKPOINT_S", "0")  # Tune's state on storage at every step
    plan = parse_plan(spec(name, 8, seeds=(0,)), f"{name}.yaml")
    results = tmp_path / "results"
    with pytest.raises(DriverCrash):
        run_sweep(plan, track=False, storage_path=str(results), out=io.StringIO(), verbose=0,
                  extra_callbacks=[CrashBetween(results, name, 1, low, high)])
    (run_dir,) = results.glob(f"{name}/*")
    return plan, results, run_dir


def test_a_trial_that_ran_without_an_mlflow_run_gets_its_rows_on_disk(ray_session, tmp_path, monkeypatch):
    """A driver that logged nothing to MLflow stops mid-trial, past a checkpoint; the resume
    restores the trial from it: its run holds every row of ``result.json`` once, those before
    the checkpoint too, every metric."""
    plan, results, run_dir = crashed_untracked(tmp_path, monkeypatch, "untracked", 3, 8)
    assert rows_on_disk(run_dir, LOGGED) and list(run_dir.glob("*/checkpoint_*")), "the trial had no checkpoint"

    uri = sqlite_store(tmp_path / "mlflow.db")
    run_sweep(plan, tracking_uri=uri, storage_path=str(results), out=io.StringIO(), verbose=0, resume=True)
    assert restored_from_checkpoint(run_dir) == [True]
    check_every_row_once(uri, "untracked", run_dir, 8)


@pytest.mark.slow
def test_a_trial_restarted_from_scratch_keeps_its_first_attempts_rows(ray_session, tmp_path, monkeypatch):
    """The rule for a trial with no checkpoint: a driver that logged nothing stops before the
    trial's first checkpoint; the resume starts it again from scratch and it reports steps 1..k
    again. Its run keeps the killed attempt's rows (read from ``result.json``: their
    ``time_total_s``), drops the repeated steps (counted in ``haepo.replayed_steps``), and holds
    each row once."""
    plan, results, run_dir = crashed_untracked(tmp_path, monkeypatch, "scratch", 0, 3)
    assert not list(run_dir.glob("*/checkpoint_*")), "the trial had a checkpoint"
    (path,) = run_dir.glob("*/result.json")
    first = [json.loads(line) for line in path.read_text().splitlines()]

    uri = sqlite_store(tmp_path / "mlflow.db")
    result = run_sweep(plan, tracking_uri=uri, storage_path=str(results), out=io.StringIO(), verbose=0, resume=True)
    last = json.loads(path.read_text().splitlines()[-1])
    assert last["iterations_since_restore"] == last["training_iteration"] == 8  # from scratch
    check_every_row_once(uri, "scratch", run_dir, 8)
    client = MlflowClient(uri)
    run_id = result.trials[0].run_id
    held = {m.step: m.value for m in client.get_metric_history(run_id, "time_total_s")}
    assert [held[row["training_iteration"]] for row in first] == [row["time_total_s"] for row in first]
    assert int(client.get_run(run_id).data.tags["haepo.replayed_steps"]) == len(first)


# --------------------------------------------------------------------------- driver, server, trial kills


def child_runs_in(db: Path, experiment: str) -> int:
    """Child runs of ``experiment`` in the server's SQLite store."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
        return conn.execute(
            "select count(*) from tags t join runs r on r.run_uuid = t.run_uuid join experiments e on "
            "e.experiment_id = r.experiment_id where t.key = 'mlflow.parentRunId' and e.name = ?",
            (experiment,)).fetchone()[0]


def parent_known(cwd: Path) -> bool:
    """The driver (output in ``cwd/first.log``) holds its parent run's id: it printed it. (The
    parent's row in the store is not enough: a server killed between its commit and its answer
    leaves a driver that never heard of the run, and so runs the sweep untracked.)"""
    return "MLflow parent run: " in (cwd / "first.log").read_text()


def state_trials(results: Path, experiment: str) -> dict[str, tuple[str, int]]:
    """trial id -> (status, iteration of its last result) in the newest experiment state on
    storage, what a resume restores (past a checkpoint's iteration, the state names that
    checkpoint); {} while there is none or it is being written."""
    states = sorted(results.glob(f"{experiment}/*/experiment_state-*.json"))
    if not states:
        return {}
    try:
        data = json.loads(states[-1].read_text())
    except (OSError, ValueError):
        return {}
    out = {}
    for trial_json, runtime_json in data["trial_data"]:
        trial, last = json.loads(trial_json), json.loads(runtime_json).get("last_result") or {}
        out[trial["trial_id"]] = (trial["status"], int(last.get("training_iteration") or 0))
    return out


def state_iterations(results: Path, experiment: str) -> dict[str, int]:
    """trial id -> the iteration of its last result in Tune's newest state on storage."""
    return {trial: it for trial, (_, it) in state_trials(results, experiment).items()}


@pytest.fixture
def lagging(monkeypatch):
    """Env of the drivers: retried calls give up fast on a dead server (each is held for
    later, whatever the retries), and Tune snapshots its state every second, so that a kill
    lands after a snapshot that names the trials' checkpoints."""
    monkeypatch.setenv("HAEPO_MLFLOW_RETRIES", "0")
    monkeypatch.setenv("HAEPO_MLFLOW_TIMEOUT_S", "10")
    monkeypatch.setenv("TUNE_GLOBAL_CHECKPOINT_S", "1")


@pytest.mark.slow
def test_driver_killed_while_the_tracker_lags(ray_session, lagging, tmp_path, monkeypatch, capfd):
    """The repro of issue 44: the server killed right after the driver has its parent run; the driver
    SIGKILLed once both trials are past their first checkpoint (in Tune's state on storage)
    with no child run in MLflow; the server started again; ``--resume``. Tune restores both
    trials from a checkpoint; MLflow then holds every row of their ``result.json`` once."""
    experiment, iterations = "lagged", 12
    server = MLflowServer(tmp_path / "server")
    try:
        data = spec(experiment, iterations)
        data["settings"]["min_time_s_per_iteration"] = 1.0  # a window of seconds for the kill
        path = tmp_path / f"{experiment}.yaml"
        path.write_text(json.dumps(data))
        results = tmp_path / "results"
        args = sweep_args(path, server.uri, results, ray_session.get_runtime_context().gcs_address)
        seen: dict[str, int] = {}

        def ready() -> bool:
            if server.proc.poll() is None:
                if parent_known(tmp_path):
                    server.stop()
                return False
            seen.clear()
            seen.update(state_iterations(results, experiment))
            return len(seen) == 2 and all(3 < it < iterations for it in seen.values())

        kill_driver_when(args, tmp_path, ready)
        assert child_runs_in(server.db, experiment) == 0, "the writer was not behind"
        assert len(seen) == 2 and all(3 < it < iterations for it in seen.values()), seen
        server.start()
        monkeypatch.chdir(tmp_path)
        resume_driver(args, monkeypatch, capfd)
        (run_dir,) = results.glob(f"{experiment}/*")
        assert restored_from_checkpoint(run_dir) == [True, True]
        check_every_row_once(server.uri, experiment, run_dir, iterations)
    finally:
        server.kill()


@pytest.mark.slow
def test_driver_killed_during_the_final_flush(ray_session, lagging, tmp_path, monkeypatch, capfd):
    """The server killed right after the driver has its parent run; the driver SIGKILLed once every
    trial has ended (Tune's final state on storage) while its writer waits at the sweep's end
    for the server; the server back, ``--resume``: Tune has no trial left to run, and MLflow
    gets every row, every run's end and the parent's, once."""
    experiment, iterations = "flushed", 6
    server = MLflowServer(tmp_path / "server")
    try:
        path = tmp_path / f"{experiment}.yaml"
        path.write_text(json.dumps(spec(experiment, iterations)))
        results = tmp_path / "results"
        args = sweep_args(path, server.uri, results, ray_session.get_runtime_context().gcs_address)
        ended_at: list[float] = []

        def ready() -> bool:
            if server.proc.poll() is None:
                if parent_known(tmp_path):
                    server.stop()
                return False
            state = state_trials(results, experiment)
            if not ended_at and len(state) == 2 and set(state.values()) == {("TERMINATED", iterations)}:
                ended_at.append(time.monotonic())
            return bool(ended_at) and time.monotonic() - ended_at[0] > 3  # in the end's wait

        # The end waits up to 120 s for the server (HAEPO_MLFLOW_CLOSE_TIMEOUT_S): the kill lands in it.
        # Paused: the driver, which makes the child runs at its trials' start, does nothing between
        # seeing the parent and stopping the server (unpaused, on a loaded machine it once logged
        # the whole sweep before the stop).
        kill_driver_when(args, tmp_path, ready, paused=True)
        (run_dir,) = results.glob(f"{experiment}/*")
        assert not (run_dir / "haepo_summary.json").exists(), "the sweep had ended"
        assert child_runs_in(server.db, experiment) == 0, "the writer was not behind"
        server.start()
        monkeypatch.chdir(tmp_path)
        resume_driver(args, monkeypatch, capfd)
        check_every_row_once(server.uri, experiment, run_dir, iterations)
    finally:
        server.kill()


class TrialKilledInOutage(ServerOutage):
    """:class:`ServerOutage` (the server killed at the first result once it stored a child's
    metrics, started again after ``results_during`` results without it), and meanwhile, at the
    first result past a checkpoint (iteration 4), that trial's actor SIGKILLed."""

    def __init__(self, server: MLflowServer, experiment: str, results_during: int):
        super().__init__(server, experiment, results_during)
        self.actor_killed: tuple[str, int, bool] | None = None  # trial id, iteration, server down

    def on_trial_result(self, iteration, trials, trial, result, **info):
        super().on_trial_result(iteration, trials, trial, result, **info)
        if self.killed_at is not None and self.actor_killed is None and result["training_iteration"] >= 4:
            self.actor_killed = (trial.trial_id, result["training_iteration"],
                                 self.restart is None and self.server.proc.poll() is not None)
            os.kill(result["pid"], signal.SIGKILL)


@pytest.mark.slow
def test_trial_killed_during_an_outage(ray_session, tmp_path, monkeypatch):
    """A trial's actor SIGKILLed past its first checkpoint while the server is down: Tune
    retries it from the checkpoint, it reports some steps again, the server comes back; its
    run holds each row of ``result.json`` once and counts the failure."""
    monkeypatch.chdir(tmp_path)
    experiment, iterations = "actor", 10
    server = MLflowServer(tmp_path / "server")
    try:
        outage = TrialKilledInOutage(server, experiment, results_during=10)
        plan = parse_plan(spec(experiment, iterations, max_failures=1), f"{experiment}.yaml")
        result = run_sweep(plan, tracking_uri=server.uri, storage_path=str(tmp_path / "results"),
                           out=io.StringIO(), verbose=0, extra_callbacks=[outage],
                           callback_kwargs={"retries": 0, "timeout_s": 15, "close_timeout_s": 60})
        assert outage.actor_killed is not None and outage.actor_killed[2], outage.actor_killed
        outage.restart.result(timeout=0)
        killed = outage.actor_killed[0]
        assert {t.trial_id: t.num_failures for t in result.trials}[killed] == 1
        run_dir = Path(result.run_dir)
        restored = dict(zip(sorted(p.parent.name for p in run_dir.glob("*/result.json")),
                            restored_from_checkpoint(run_dir)))
        assert [v for k, v in restored.items() if killed in k] == [True]
        check_every_row_once(server.uri, experiment, run_dir, iterations)
        client = MlflowClient(server.uri)
        run = client.get_run({t.trial_id: t.run_id for t in result.trials}[killed])
        assert run.data.tags["haepo.num_failures"] == "1" and int(run.data.tags["haepo.replayed_steps"]) >= 1
    finally:
        server.kill()


class ServerDownAtStart(tune.Callback):
    """Kills the server when the first trial ends (the second has not started: one trial at a
    time) and starts it again, on a thread, once the second trial reported ``results_during``
    results; records whether the server was down when the second trial started."""

    def __init__(self, server: MLflowServer, results_during: int):
        self.server, self.results_during = server, results_during
        self.down_at_start: bool | None = None
        self.results = 0
        self.restart: Future | None = None

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("server", "restart")}

    def on_trial_complete(self, iteration, trials, trial, **info):
        if self.down_at_start is None:
            self.server.stop()
        elif self.restart is not None:
            futures.wait([self.restart])

    def on_trial_start(self, iteration, trials, trial, **info):
        if any(t.status == "TERMINATED" for t in trials):
            self.down_at_start = self.server.proc.poll() is not None

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if self.down_at_start is None:
            return
        self.results += 1
        if self.results == self.results_during:
            pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlflow-restart")
            self.restart = pool.submit(self.server.start)
            pool.shutdown(wait=False)


@pytest.mark.slow
def test_server_down_when_a_trial_starts(ray_session, tmp_path, monkeypatch):
    """The server is down when a trial starts (its run cannot be created then) and comes back
    while it runs: its run is created once and holds each row of ``result.json`` once."""
    monkeypatch.chdir(tmp_path)
    experiment, iterations = "startless", 6
    server = MLflowServer(tmp_path / "server")
    try:
        down = ServerDownAtStart(server, results_during=3)
        plan = parse_plan(spec(experiment, iterations, max_concurrent_trials=1), f"{experiment}.yaml")
        result = run_sweep(plan, tracking_uri=server.uri, storage_path=str(tmp_path / "results"),
                           out=io.StringIO(), verbose=0, extra_callbacks=[down],
                           callback_kwargs={"retries": 0, "timeout_s": 15, "close_timeout_s": 60})
        assert down.down_at_start is True and down.restart is not None
        down.restart.result(timeout=0)
        assert not result.not_logged
        check_every_row_once(server.uri, experiment, Path(result.run_dir), iterations)
    finally:
        server.kill()
