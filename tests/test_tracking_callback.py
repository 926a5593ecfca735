"""The Tune callback that logs a sweep to MLflow (:mod:`haepo_ray.tracking.callback`): its
pickle, its settings' errors, an unreachable server at start, the sweep against a real ``mlflow
server`` over HTTP, and a tracking server that dies or goes away mid-sweep (the sweep finishes;
nothing is lost, or a warning says what was not logged)."""

from __future__ import annotations

import io
import logging
import os
import pickle
import re
import signal
import sqlite3
import time
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from helpers import SMOKE, MLflowServer, free_port, sqlite_store
from mlflow.tracking import MlflowClient
from ray import tune
from sweep_checks import check_sweep_in_mlflow

from haepo_ray import tracking
from haepo_ray.sweep.kinds import parse_plan
from haepo_ray.sweep.runner import run_sweep
from haepo_ray.tracking.writer import MAX_PROBE_INTERVAL_S


def test_callback_pickles_as_its_settings(tmp_path):
    """Tune pickles callbacks into tuner.pkl: a started callback (client, thread, queue)
    pickles as its settings and retry policy only, and unpickles unstarted."""
    settings = tracking.SweepTracking(sqlite_store(tmp_path / "mlflow.db"), "exp", "sweep-1",
                                      sweep_dir=str(tmp_path), search_keys={"batch_size": "episodes_per_batch"})
    cb = tracking.MLflowSweepCallback(settings, tracking.RetryPolicy(retries=0))
    try:
        assert cb.start()
        copy = pickle.loads(pickle.dumps(cb))
    finally:
        cb.close()
    assert (copy.settings, copy.retry) == (settings, cb.retry)
    assert copy.parent_run_id is None and copy.run_id_of("any") is None


def test_bad_settings_say_what_is_wrong():
    with pytest.raises(ValueError, match="retries .HAEPO_MLFLOW_RETRIES. must be >= 0, got -1"):
        tracking.RetryPolicy(retries=-1)
    with pytest.raises(ValueError, match="mode must be 'max' or 'min', got 'best'"):
        tracking.SweepTracking("sqlite:///x.db", "exp", "sweep-1", mode="best")


def test_unreachable_tracking_server_warns_and_does_not_raise(tmp_path, caplog):
    port = free_port()  # nothing listens there
    cb = tracking.MLflowSweepCallback(
        tracking.SweepTracking(f"http://127.0.0.1:{port}", "exp", "sweep-1", sweep_dir=str(tmp_path)),
        tracking.RetryPolicy(retries=1, backoff_s=0.05, timeout_s=2))
    with caplog.at_level(logging.WARNING, logger="haepo_ray.tracking"):
        assert cb.start() is None
        cb.close()
    assert cb.not_logged and cb.not_logged[0].what == "experiment"
    assert "runs without tracking" in caplog.text and "once it answers, `haepo sweep --resume` logs" in caplog.text
    assert (tmp_path / "mlflow_not_logged.jsonl").exists()


def test_a_store_that_answers_with_errors_is_said_to_fail_not_to_be_away(tmp_path, caplog):
    """Calls that MLflow answers with a server error (not an outage, not a refusal of bad input)
    are retried, then recorded; after two, each call is tried once, and the warning says that
    MLflow answers with errors, and which, not that it does not answer."""
    from mlflow.exceptions import MlflowException

    from haepo_ray.tracking.retry import MLflowCalls

    calls = MLflowCalls(sqlite_store(tmp_path / "mlflow.db"), tracking.RetryPolicy(retries=1, backoff_s=0))
    tries = []

    def broken():
        tries.append(len(tries))
        raise MlflowException("the handler broke", error_code="INTERNAL_ERROR")

    with caplog.at_level(logging.WARNING, logger="haepo_ray.tracking"):
        for step in (1, 2, 3):
            assert calls.call("metrics", "t1", f"step {step}", broken, hold=True) == (False, None)
    assert len(tries) == 2 + 2 + 1 and calls.down
    assert [n.detail for n in calls.not_logged] == ["step 1", "step 2", "step 3"]
    assert "answers with errors (MlflowException: the handler broke)" in caplog.text
    assert "does not answer" not in caplog.text


# --------------------------------------------------------------------------- mlflow server


@pytest.fixture(scope="module")
def mlflow_servers(tmp_path_factory):
    """The module's servers: a live one is shared (its start takes 20 to 40 s here); the test
    that kills it takes it last (it is the last in this file), and any later test gets a new one."""
    servers: list[MLflowServer] = []

    def live() -> MLflowServer:
        if not servers or servers[-1].proc.poll() is not None:
            servers.append(MLflowServer(tmp_path_factory.mktemp("mlflow-server")))
        return servers[-1]

    try:
        yield live
    finally:
        for server in servers:
            server.kill()


@pytest.fixture
def mlflow_server(mlflow_servers) -> MLflowServer:
    return mlflow_servers()


# Slow tier: test_tracking_server_outage_loses_nothing tracks the smoke sweep over HTTP too and
# checks its runs the same way (check_sweep_in_mlflow: params, tags, every step, the checkpoint
# through the server), an outage in the middle; test_llm_sweep's smoke sweep uses a server too.
@pytest.mark.slow
def test_smoke_sweep_remote_mlflow_server(ray_session, mlflow_server, tmp_path, monkeypatch):
    """The smoke spec tracked over HTTP. Cut to 2 trials of 4 iterations (a checkpoint at 2
    and at the end): every kind of MLflow call goes through the server just the same, and
    test_sweep_e2e runs the whole smoke sweep against SQLite."""
    monkeypatch.chdir(tmp_path)
    data = yaml.safe_load(SMOKE.read_text())
    data["search_space"]["seed"] = {"grid": [0]}
    data.update(stop={"iterations": 4}, checkpoint_frequency=2)
    result = run_sweep(parse_plan(data, "smoke.yaml"), tracking_uri=mlflow_server.uri,
                       storage_path=str(tmp_path / "results"), out=io.StringIO())
    assert len(result.trials) == 2
    assert all(t.status == "TERMINATED" and t.iterations == 4 for t in result.trials)
    assert not result.not_logged
    check_sweep_in_mlflow(mlflow_server.uri, "smoke", result, iterations=4)
    # The checkpoints went through the server to its artifact store.
    experiment_id = MlflowClient(mlflow_server.uri).get_experiment_by_name("smoke").experiment_id
    assert list((mlflow_server.root / "artifacts" / experiment_id).rglob("rllib_checkpoint.json"))


# Runs of one experiment (the server is shared with the other tests of this file).
_RUNS_OF = ("select r.run_uuid from runs r join experiments e on e.experiment_id = r.experiment_id "
            "where e.name = ?")


def _child_metric_rows(db: Path, experiment: str) -> int:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            return conn.execute(
                "select count(*) from metrics where run_uuid in "
                f"(select run_uuid from tags where key = 'mlflow.parentRunId' and run_uuid in ({_RUNS_OF}))",
                (experiment,)).fetchone()[0]
    except sqlite3.Error:
        return 0


class KillServerMidSweep(tune.Callback):
    """Kills the tracking server (SIGKILL, by process group) at the first trial result, once
    the server has stored metrics of a child run: mid-sweep, while trials are running, and
    after the sweep's client holds that child's run id (it logs metrics only then; a kill
    right after the server stored a run could lose the reply that creates it).

    Tune calls callbacks after the tracking callback has queued the result, on the thread that
    starts the trials' next iterations, so waiting here holds the sweep (without using CPU)
    until the tracking thread has written to the server."""

    def __init__(self, pid: int, db: Path, experiment: str):
        self.pid, self.db, self.experiment, self.killed_at = pid, db, experiment, None

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if self.killed_at is not None:
            return
        deadline = time.monotonic() + 60
        while _child_metric_rows(self.db, self.experiment) < 1:
            assert time.monotonic() < deadline, "the server stored no metrics of a trial in 60 s"
            time.sleep(0.1)
        os.killpg(self.pid, signal.SIGKILL)
        self.killed_at = result["training_iteration"]


ITERATIONS = 8  # the kill lands at the first result; the trials then go on without the server


class ServerOutage(KillServerMidSweep):
    """Kills the tracking server as :class:`KillServerMidSweep` does, then starts it again (its
    port, its store) on a thread of its own once ``results_during`` more trial results came in
    without it; the sweep goes on meanwhile (the server's start-up, seconds, is part of the
    outage). :attr:`restart` is that start's Future: its ``result()`` raises what the start
    raised. A trial's end waits for the restart to be done, so that the sweep's end, where the
    tracking callback closes its writer, comes with the server up (or the start failed)."""

    def __init__(self, server: MLflowServer, experiment: str, results_during: int):
        super().__init__(server.proc.pid, server.db, experiment)
        self.server, self.results_during = server, results_during
        self.results_while_down = 0
        self.restart: Future | None = None

    def __getstate__(self):  # Tune saves its callbacks; the server and the restart stay here
        return {k: v for k, v in self.__dict__.items() if k not in ("server", "restart")}

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if self.killed_at is None:
            super().on_trial_result(iteration, trials, trial, result, **info)
        elif self.restart is None:
            self.results_while_down += 1
            if self.results_while_down >= self.results_during:
                pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlflow-restart")
                self.restart = pool.submit(self.server.start)
                pool.shutdown(wait=False)  # the start runs on; nothing else is submitted

    def _restarted(self) -> None:
        if self.restart is not None:
            futures.wait([self.restart])  # done or failed; the test's result() raises a failure

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._restarted()

    def on_trial_error(self, iteration, trials, trial, **info):
        self._restarted()


@pytest.mark.slow  # the fast tier's outage proof: test_tracking_server_killed_mid_sweep (below)
def test_tracking_server_outage_loses_nothing(ray_session, mlflow_server, tmp_path, monkeypatch, caplog):
    """The server is killed mid-sweep, for longer than the retry budget (1 retry after 0.1 s),
    and started again: every trial's run holds every (metric, step) once, nothing is lost."""
    monkeypatch.chdir(tmp_path)
    data = yaml.safe_load(SMOKE.read_text())
    data.update(name="outage", search_space={"seed": {"grid": [0, 1]}, "lr": {"grid": [0.05]}})
    data["stop"] = {"iterations": ITERATIONS}
    outage = ServerOutage(mlflow_server, "outage", results_during=4)

    with caplog.at_level(logging.WARNING, logger="haepo_ray.tracking"):
        result = run_sweep(parse_plan(data, "outage.yaml"), tracking_uri=mlflow_server.uri,
                           storage_path=str(tmp_path / "results"), out=io.StringIO(),
                           extra_callbacks=[outage],
                           # The server is up when the writer closes (the trials' ends wait for
                           # the restart): the writer's next probe comes within its longest
                           # interval, and the calls answer within their timeout.
                           callback_kwargs={"retries": 1, "backoff_s": 0.1, "timeout_s": 15,
                                            "close_timeout_s": MAX_PROBE_INTERVAL_S + 2 * 15})
    assert outage.restart is not None, "the server was not restarted during the sweep"
    outage.restart.result(timeout=0)  # done before the sweep ended; raises what the restart raised

    assert outage.killed_at is not None and outage.killed_at < ITERATIONS, outage.killed_at
    assert outage.results_while_down == 4
    assert "does not answer" in caplog.text and "answers again" in caplog.text
    assert [(t.status, t.iterations) for t in result.trials] == [("TERMINATED", ITERATIONS)] * 2
    assert result.not_logged == []
    (run_dir,) = list((tmp_path / "results" / "outage").iterdir())
    assert not (run_dir / "mlflow_not_logged.jsonl").exists()
    assert not (run_dir / "mlflow_backlog.pkl").exists()
    # One parent, one child per trial, each with every step of its metrics, params, tags,
    # checkpoint and status; and no (run, metric, step) row twice, whichever metric.
    check_sweep_in_mlflow(mlflow_server.uri, "outage", result, iterations=ITERATIONS)
    with sqlite3.connect(mlflow_server.db) as conn:
        twice = conn.execute(
            f"select run_uuid, key, step, count(*) from metrics where run_uuid in ({_RUNS_OF}) "
            "group by run_uuid, key, step having count(*) > 1", ("outage",)).fetchall()
        children = conn.execute(
            f"select count(*) from tags where key = 'mlflow.parentRunId' and run_uuid in ({_RUNS_OF})",
            ("outage",)).fetchone()[0]
    assert twice == [] and children == 2


# Last in this file: the server it kills stays down (the outage test brings its server back,
# so that this test takes it on).
def test_tracking_server_killed_mid_sweep(ray_session, mlflow_server, tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    data = yaml.safe_load(SMOKE.read_text())
    data.update(name="doomed", search_space={"seed": {"grid": [0, 1]}})
    data["stop"] = {"iterations": ITERATIONS}
    data["settings"].update(lr=0.05)
    spec = parse_plan(data, "doomed.yaml")
    killer = KillServerMidSweep(mlflow_server.proc.pid, mlflow_server.db, "doomed")

    with caplog.at_level(logging.WARNING, logger="haepo_ray.tracking"):
        result = run_sweep(spec, tracking_uri=mlflow_server.uri, storage_path=str(tmp_path / "results"),
                           out=io.StringIO(), extra_callbacks=[killer],
                           # A killed server refuses connections at once; the timeout only
                           # bounds a slow answer of the live server on a loaded machine.
                           callback_kwargs={"retries": 1, "backoff_s": 0.1, "timeout_s": 15,
                                            "close_timeout_s": 5})

    assert mlflow_server.proc.poll() is not None, "the server was not killed"
    assert killer.killed_at is not None and killer.killed_at < ITERATIONS, killer.killed_at
    # The sweep went on and finished every trial.
    assert [(t.status, t.iterations) for t in result.trials] == [("TERMINATED", ITERATIONS)] * 2
    # ... and says what was not logged: metrics (with their steps), statuses, checkpoints.
    whats = {n.what for n in result.not_logged}
    assert {"metrics", "status", "artifact"} <= whats, whats
    assert any(n.what == "metrics" and re.match(r"steps? \d", n.detail) for n in result.not_logged)
    assert "not logged" in caplog.text and "metrics" in caplog.text
    assert "does not answer" in caplog.text
    (run_dir,) = list((tmp_path / "results" / "doomed").iterdir())
    lines = (run_dir / "mlflow_not_logged.jsonl").read_text().splitlines()
    assert len(lines) == len(result.not_logged)

    # What the server stored before it died is there: the parent and a child run.
    with sqlite3.connect(mlflow_server.db) as conn:
        roles = [r for (r,) in conn.execute(
            f"select value from tags where key = 'haepo.role' and run_uuid in ({_RUNS_OF})", ("doomed",))]
    assert roles.count("sweep") == 1 and roles.count("trial") >= 1
