"""MLflow tracking: URI resolution, the sweep against a real ``mlflow server`` over HTTP, and
a tracking server that dies mid-sweep (the sweep finishes; a warning says what was not
logged)."""

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
from types import SimpleNamespace

import pytest
import yaml
from helpers import SMOKE, MLflowServer, check_sweep_in_mlflow, free_port
from mlflow.tracking import MlflowClient
from ray import tune

from haepo_ray import names, tracking
from haepo_ray.sweep.plan import parse_plan
from haepo_ray.sweep.runner import run_sweep
from haepo_ray.tracking.writer import MAX_PROBE_INTERVAL_S

# --------------------------------------------------------------------------- URI and helpers


def test_tracking_uri_flag_then_env_then_embedded_default(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    default = tracking.resolve_tracking_uri(cwd=tmp_path)
    assert default == f"sqlite:///{tmp_path.resolve()}/.haepo/mlflow.db"
    assert (tmp_path / ".haepo").is_dir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracking.resolve_tracking_uri(cwd=tmp_path) == "http://127.0.0.1:5000"
    assert tracking.resolve_tracking_uri("sqlite:///x.db", cwd=tmp_path) == "sqlite:///x.db"


def test_sqlite_artifacts_live_next_to_the_database(tmp_path):
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    assert tracking.artifact_location_for(uri) == (tmp_path / "store" / "mlartifacts").as_uri()
    assert tracking.artifact_location_for("http://127.0.0.1:5000") is None


def test_metrics_are_selected_flattened_and_numeric():
    result = {
        "training_iteration": 3,
        "time_total_s": 1.5,
        "done": False,
        "config": {"lr": 0.1},
        "env_runners": {"episode_return_mean": 0.5, "num_env_steps_sampled_lifetime": 120,
                        "agent_episode_returns_mean": {"default_agent": 0.5}},
        "learners": {"default_policy": {"weight_entropy": 1.2, "note": "text"}},
    }
    metrics = tracking.select_metrics(result, tracking.DEFAULT_METRICS)
    assert metrics == {
        "training_iteration": 3.0,
        "time_total_s": 1.5,
        "env_runners/episode_return_mean": 0.5,
        "env_runners/num_env_steps_sampled_lifetime": 120.0,
        "learners/default_policy/weight_entropy": 1.2,
    }
    assert not any(k.startswith("config") for k in tracking.select_metrics(result, ["*"]))
    assert tracking.sanitize_key("a:b/c d=e") == "a_b/c d_e"


def test_one_best_trial_rule_for_mlflow_and_the_sweep_summary():
    """The parent run's best trial and the sweep's printed ranking come from one rule: the
    last reported value, NaN and missing values last, ties in trial order."""
    from haepo_ray.sweep.results import SweepResult, TrialSummary

    last = {"a": 0.5, "b": float("nan"), "c": 0.9, "d": None, "e": 0.9, "f": 0.1}
    trials = [SimpleNamespace(trial_id=k, last_result={"env_runners": {"episode_return_mean": v}})
              for k, v in last.items()]
    for mode, ranked in (("max", "ceafbd"), ("min", "facebd")):
        summary = tracking.schema.summarize_trials(trials, "env_runners/episode_return_mean", mode)
        assert summary["num_trials"] == 6
        assert summary["best"] == {"trial_id": ranked[0], "value": last[ranked[0]]}
        result = SweepResult("dir", "exp", None, None, "env_runners/episode_return_mean", mode, trials=[
            TrialSummary(t.trial_id, t.trial_id, "TERMINATED", 1,
                         tracking.metric_value(t.last_result, "env_runners/episode_return_mean"), {}, None)
            for t in trials])
        assert "".join(t.trial_id for t in result.ranked()) == ranked
        assert result.best.trial_id == ranked[0]
    assert tracking.schema.summarize_trials(trials[1:2], "env_runners/episode_return_mean")["best"] is None


def test_callback_pickles_as_its_settings(tmp_path):
    """Tune pickles callbacks into tuner.pkl: a started callback (client, thread, queue)
    pickles as its settings and retry policy only, and unpickles unstarted."""
    settings = tracking.SweepTracking(f"sqlite:///{tmp_path / 'mlflow.db'}", "exp", "sweep-1",
                                      sweep_dir=str(tmp_path), search_keys={"batch_size": "episodes_per_batch"})
    cb = tracking.MLflowSweepCallback(settings, tracking.RetryPolicy(retries=0))
    try:
        assert cb.start()
        copy = pickle.loads(pickle.dumps(cb))
    finally:
        cb.close()
    assert (copy.settings, copy.retry) == (settings, cb.retry)
    assert copy.parent_run_id is None and copy.run_id_of("any") is None


def test_a_retried_create_finds_the_run_whose_reply_was_lost(tmp_path):
    """MLflow stored a trial's child run but its reply was lost: the writer's retry finds that
    run instead of making a second, and the trial's metrics go to it."""
    from haepo_ray.tracking.queries import child_runs
    from haepo_ray.tracking.retry import MLflowCalls
    from haepo_ray.tracking.writer import Metrics, MLflowWriter, StartRun

    calls = MLflowCalls(f"sqlite:///{tmp_path / 'mlflow.db'}", tracking.RetryPolicy(retries=2, backoff_s=0))
    client = calls.connect()
    exp = client.create_experiment("exp", artifact_location=(tmp_path / "artifacts").as_uri())
    parent = client.create_run(exp, tags={"haepo.role": "sweep"}).info.run_id
    create, stored = client.create_run, []

    def create_reply_lost(*args, **kwargs):
        run = create(*args, **kwargs)
        stored.append(run.info.run_id)
        if len(stored) == 1:
            raise ConnectionError("reply lost")
        return run

    client.create_run = create_reply_lost
    writer = MLflowWriter(calls, flush_interval_s=0)
    writer.start(exp, parent, {})
    writer.put(StartRun("t1", "trial_1", {"haepo.trial_id": "t1"}, {"lr": "0.1"}))
    writer.put(Metrics("t1", 1, int(time.time() * 1000), {"training_iteration": 1.0}))
    writer.stop()

    (child,) = child_runs(client, exp, parent)
    assert stored == [child.info.run_id] == [writer.run_id_of("t1")]
    assert child.data.params == {"lr": "0.1"} and child.data.metrics == {"training_iteration": 1.0}
    assert not calls.not_logged


class Outage:
    """Makes an MLflow client's calls fail as a stopped server's do (connection refused) while
    ``down``; ``lose_reply`` makes the next ``log_batch`` reach the store and then fail, as a
    server that dies before it answers."""

    METHODS = ("create_run", "log_batch", "get_metric_history", "get_run", "update_run", "set_terminated",
               "search_runs", "log_text")

    def __init__(self, client):
        self.down, self.lose_reply, self.refused = False, False, 0
        for name in self.METHODS:
            setattr(client, name, self._wrap(name, getattr(client, name)))

    def _wrap(self, name, call):
        def wrapped(*args, **kwargs):
            if self.lose_reply and name == "log_batch" and kwargs.get("metrics"):
                self.lose_reply, self.down = False, True
                call(*args, **kwargs)
            if self.down:
                self.refused += 1
                raise ConnectionError("[Errno 111] Connection refused")
            return call(*args, **kwargs)
        return wrapped


def test_the_backlog_keeps_order_across_memory_and_file(tmp_path):
    from haepo_ray.tracking.backlog import Backlog

    path = tmp_path / "backlog.pkl"
    backlog = Backlog(str(path), max_in_memory=3)
    barrier = tracking.writer.Barrier()
    for item in [1, 2, 3, 4, barrier, 5]:
        backlog.append(item)
    assert len(backlog) == 6 and backlog.in_file == 3 and path.exists()
    assert backlog.popleft() == 1
    backlog.put_back([0, 1])
    backlog.append(6)  # the file still holds messages: behind them
    out = [backlog.popleft() for _ in range(len(backlog))]
    assert out[:5] == [0, 1, 2, 3, 4] and out[6:] == [5, 6]
    assert out[5].done is barrier.done  # the event a flush waits on, not a copy
    assert len(backlog) == 0 and not path.exists() and backlog.spilled_total == 4
    with pytest.raises(IndexError):
        backlog.popleft()
    with pytest.raises(ValueError, match="max_in_memory must be >= 1"):
        Backlog(None, 0)


def test_the_backlog_gives_back_each_message_as_it_was_queued(tmp_path):
    """Messages that hold one object twice (a StartRun's trial id is also its tag) come back
    from the file equal, several read back at a time (10,000 one-iteration trials once came
    back with other trials' ids in their tags)."""
    from haepo_ray.tracking.backlog import Backlog

    messages = []
    for i in range(12):
        trial_id = f"trial_{i:05d}"
        messages.append(tracking.writer.StartRun(trial_id, f"trial {i}", {names.TRIAL_ID: trial_id}, {"lr": str(i)}))
        messages.append(tracking.writer.Tags(trial_id, {names.NUM_FAILURES: "0", names.ERROR: trial_id}))
    backlog = Backlog(str(tmp_path / "backlog.pkl"), max_in_memory=4)
    for message in messages:
        backlog.append(message)
    assert backlog.in_file == len(messages) - 4
    assert [backlog.popleft() for _ in range(len(messages))] == messages


def test_an_outage_is_written_in_order_and_once_when_mlflow_is_back(tmp_path, caplog):
    """MLflow goes away while a metrics batch is written (the store took it, the answer was
    lost) and stays away past the retry budget while the trial goes on: the writer keeps what
    it could not write (past 4 messages in its file), tries again and, once MLflow is back,
    writes it all in order: every step once, the end status, nothing recorded as lost."""
    from haepo_ray.tracking.retry import MLflowCalls
    from haepo_ray.tracking.writer import EndRun, Metrics, MLflowWriter, StartRun, Tags

    calls = MLflowCalls(f"sqlite:///{tmp_path / 'mlflow.db'}", tracking.RetryPolicy(retries=1, backoff_s=0))
    client = calls.connect()
    exp = client.create_experiment("exp", artifact_location=(tmp_path / "artifacts").as_uri())
    parent = client.create_run(exp, tags={"haepo.role": "sweep"}).info.run_id
    outage = Outage(client)
    spill = tmp_path / "backlog.pkl"
    writer = MLflowWriter(calls, flush_interval_s=0, backlog_path=str(spill), max_in_memory=4)
    writer.start(exp, parent, {})
    writer.put(StartRun("t1", "trial_1", {"haepo.trial_id": "t1"}, {"lr": "0.1"}))
    writer.put(Metrics("t1", 1, 1, {"loss": 1.0, "reward": 1.0}))
    assert writer.flush(30)
    outage.lose_reply = True
    with caplog.at_level(logging.WARNING, logger="haepo_ray.tracking"):
        writer.put(Metrics("t1", 2, 2, {"loss": 2.0, "reward": 2.0}))
        assert not writer.flush(30) and writer.holding
        for step in range(3, 21):
            writer.put(Metrics("t1", step, step, {"loss": float(step), "reward": float(step)}))
        writer.put(Tags("t1", {"haepo.node_ip": "10.0.0.2"}))
        writer.put(EndRun("t1", "FINISHED", None, None, 0))
        deadline = time.monotonic() + 30
        file_seen = False  # the spill file, in the folder given (while it holds messages)
        while writer.spilled == 0 or writer.backlog():
            assert time.monotonic() < deadline, (writer.spilled, writer.backlog())
            file_seen = file_seen or spill.exists()
            time.sleep(0.05)
            if writer.spilled and writer.backlog() >= 20:
                outage.down = False
        writer.stop()
    assert file_seen
    run = client.get_run(writer.run_id_of("t1"))
    for key in ("loss", "reward"):
        history = client.get_metric_history(run.info.run_id, key)
        assert sorted((m.step, m.value) for m in history) == [(s, float(s)) for s in range(1, 21)], key
    assert run.info.status == "FINISHED" and run.data.tags["haepo.node_ip"] == "10.0.0.2"
    assert outage.refused >= 2 and writer.spilled > 0 and not spill.exists()
    assert not calls.not_logged
    assert "does not answer" in caplog.text and "answers again" in caplog.text


def test_what_waits_for_mlflow_past_the_end_is_recorded(tmp_path):
    """MLflow stays away past the end's wait: what waited is recorded as not logged, by kind."""
    from haepo_ray.tracking.retry import MLflowCalls
    from haepo_ray.tracking.writer import EndRun, Metrics, MLflowWriter, StartRun

    calls = MLflowCalls(f"sqlite:///{tmp_path / 'mlflow.db'}",
                        tracking.RetryPolicy(retries=0, close_timeout_s=1.5))
    client = calls.connect()
    exp = client.create_experiment("exp", artifact_location=(tmp_path / "artifacts").as_uri())
    outage = Outage(client)
    outage.down = True
    writer = MLflowWriter(calls, flush_interval_s=0)
    writer.start(exp, None, {})
    writer.put(StartRun("t1", "trial_1", {"haepo.trial_id": "t1"}, {}))
    writer.put(Metrics("t1", 1, 1, {"loss": 1.0}))
    writer.put(EndRun("t1", "FINISHED", None, None, 0))
    writer.stop()
    assert [(n.what, n.detail) for n in calls.not_logged] == [
        ("child run", "child run of trial trial_1"), ("metrics", "step 1: 1 values"), ("status", "status FINISHED")]
    assert all("sweep ended before MLflow answered" in n.error for n in calls.not_logged)


def test_a_resumed_writer_completes_the_partly_written_step_and_logs_nothing_twice(tmp_path):
    """A killed driver left a language-model trial's run with updates 1-3 and part of update 4
    (MLflow's per-call limit split it). The resumed writer gets the run's results again, as a
    resumed sweep re-reads them and its restored trial repeats them: it logs the rest of
    update 4 and update 5, nothing twice, whatever the step key (here ``update``, which
    this spec does not log as a metric)."""
    from mlflow.entities import Metric

    from haepo_ray.tracking.retry import MLflowCalls
    from haepo_ray.tracking.writer import Metrics, MLflowWriter, StartRun

    calls = MLflowCalls(f"sqlite:///{tmp_path / 'mlflow.db'}", tracking.RetryPolicy(retries=0))
    client = calls.connect()
    exp = client.create_experiment("exp", artifact_location=(tmp_path / "artifacts").as_uri())
    parent = client.create_run(exp, tags={"haepo.role": "sweep"}).info.run_id
    child = client.create_run(exp, tags={"mlflow.parentRunId": parent, "haepo.trial_id": "t1"}).info.run_id
    keys = ("reward_mean", "loss")
    client.log_batch(child, metrics=[Metric(k, float(s), 0, s) for s in (1, 2, 3) for k in keys]
                     + [Metric("reward_mean", 4.0, 0, 4)])
    writer = MLflowWriter(calls, flush_interval_s=0)
    writer.start(exp, parent, {"t1": child})
    writer.put(StartRun("t1", "trial_1", {"haepo.trial_id": "t1"}, {}))
    for step in (1, 2, 3, 4, 3, 4, 5):
        writer.put(Metrics("t1", step, 1, {k: float(step) for k in keys}))
    writer.stop()

    for key in keys:
        history = client.get_metric_history(child, key)
        assert sorted(m.step for m in history) == [1, 2, 3, 4, 5], key
        assert all(m.timestamp == 0 for m in history if m.step < 4 or key == "reward_mean" and m.step == 4)
    assert client.get_run(child).data.tags["haepo.replayed_steps"] == "6"  # 1-4, then 3 and 4 again
    assert not calls.not_logged


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
    assert "runs without tracking" in caplog.text
    assert (tmp_path / "mlflow_not_logged.jsonl").exists()


def test_a_train_run_is_one_run_without_parent_in_a_trials_form(tmp_path):
    """``haepo train``'s run: its tags, its params flattened, each result's default metrics at
    its iteration (once per step), the node of its results, the status it ends with."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = tracking.MLflowRun(uri, "train", "HAEPO-chain", retry=tracking.RetryPolicy(retries=0))
    assert run.start({"haepo.algorithm": "HAEPO"}, {"lr": 0.1, "model_config": {"fcnet_hiddens": [8]}})
    for step in (1, 2):
        run.log_result({"training_iteration": step, "time_total_s": 0.5 * step, "node_ip": "10.0.0.1",
                        "hostname": "h", "env_runners": {"episode_return_mean": float(step), "x": 1.0}})
    run.end("KILLED")

    client = MlflowClient(uri)
    (logged,) = client.search_runs([client.get_experiment_by_name("train").experiment_id])
    assert logged.info.run_id == run.run_id and logged.info.status == "KILLED"
    assert logged.info.run_name == "HAEPO-chain" and "mlflow.parentRunId" not in logged.data.tags
    assert {k: logged.data.tags[k] for k in ("haepo.role", "haepo.algorithm", "haepo.node_ip", "haepo.hostname")} == {
        "haepo.role": tracking.TRAIN_ROLE, "haepo.algorithm": "HAEPO", "haepo.node_ip": "10.0.0.1", "haepo.hostname": "h"}
    assert logged.data.params == {"lr": "0.1", "model_config/fcnet_hiddens": "[8]"}
    assert set(logged.data.metrics) == {"training_iteration", "time_total_s", "env_runners/episode_return_mean"}
    for key in logged.data.metrics:
        assert [m.step for m in client.get_metric_history(run.run_id, key)] == [1, 2], key
    assert not run.not_logged


def test_a_train_run_without_reachable_mlflow_warns_and_trains_on(caplog):
    run = tracking.MLflowRun(f"http://127.0.0.1:{free_port()}", "train", "r",
                             retry=tracking.RetryPolicy(retries=1, backoff_s=0.05, timeout_s=2))
    with caplog.at_level(logging.WARNING, logger="haepo_ray.tracking"):
        assert run.start({}, {"lr": 0.1}) is None
        run.log_result({"training_iteration": 1})
        run.end("FINISHED")
    assert [n.what for n in run.not_logged] == ["experiment"]
    assert "trains without tracking" in caplog.text


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
