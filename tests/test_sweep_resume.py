"""``haepo sweep --resume`` where the experiment state does not match what is on storage:

- a state copied from another run's folder is refused, naming both, before anything is written;
- a trial whose newest checkpoint was deleted restarts from its newest one that exists, or from
  scratch, and MLflow holds each (run, metric, step) once;
- ``keep_checkpoints: 1`` and the driver SIGKILLed while the state on storage names a checkpoint
  Tune had deleted (ray-project/ray#27790): the resume finishes every trial, each row once;
- a sweep started while its MLflow server is down runs untracked and says so; resumed once the
  server answers, it logs every step once.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from drivers import kill_driver_when, killed_sweep, logged_rows, metric_rows, resume_driver
from helpers import MLflowServer, sqlite_store
from mlflow.tracking import MlflowClient
from test_sweep_e2e import _flaky_env

from haepo_ray.sweep import runner
from haepo_ray.sweep.kinds import parse_plan
from haepo_ray.sweep.runner import SweepError, run_sweep
from haepo_ray.tracking import find_sweep_runs
from haepo_ray.upstream import tune_restore

LOGGED = ["time_total_s", "training_iteration"]


def tiny(name: str, iterations: int, **overrides) -> dict:
    """One HAEPO trial on a 3-state chain, checkpointed every iteration."""
    return {"name": name, "algorithm": "HAEPO", "env": "haepo/ChainMDP-v0", "env_config": {"length": 3, "horizon": 5},
            "settings": {"num_env_runners": 0, "batch_size": 4, "model_config": {"fcnet_hiddens": [8]}},
            "search": {"algorithm": "grid"}, "stop": {"iterations": iterations}, "max_failures": 0,
            "checkpoint_frequency": 1, "tracking": {"metrics": LOGGED, "log_checkpoints": False}, **overrides}


def listing(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in sorted(folder.rglob("*"))}


def check_each_step_once(uri: str, experiment: str, iterations: int, trials: int = 1) -> None:
    """One parent, FINISHED; each of its ``trials`` runs FINISHED with every step of ``LOGGED``
    once; no (run, metric, step) twice, the parent's included."""
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    parents = client.search_runs([exp.experiment_id], "tags.`haepo.role` = 'sweep'")
    assert [p.info.status for p in parents] == ["FINISHED"]
    _, children = find_sweep_runs(uri, experiment, parents[0].info.run_id)
    assert len(children) == trials
    rows = logged_rows(uri, experiment, roles=("trial", "sweep"))
    assert not {k: n for k, n in rows.items() if n > 1}, "(run, metric, step) logged more than once"
    for child in children:
        assert child.info.status == "FINISHED"
        for key in LOGGED:
            assert sorted(s for (run, k, s) in rows if run == child.info.run_id and k == key) == \
                list(range(1, iterations + 1)), key


def test_a_state_of_another_run_is_refused_before_anything_is_written(ray_session, tmp_path, monkeypatch):
    """Tune restores any state file it finds, and moves its trials' checkpoint paths into the
    folder it restores: a state copied from run A into run B would resume A's trials in B."""
    monkeypatch.chdir(tmp_path)
    plan = parse_plan(tiny("foreign", 1), "foreign.yaml")
    results = str(tmp_path / "results")
    a, b = (Path(run_sweep(plan, track=False, storage_path=results, out=io.StringIO(), verbose=0).run_dir)
            for _ in range(2))
    copied = b / "experiment_state-9999-12-31_23-59-59.json"  # the newest by name: the one a resume reads
    shutil.copyfile(max(a.glob("experiment_state-*.json")), copied)
    before = listing(b)

    uri = sqlite_store(tmp_path / "mlflow.db")
    with pytest.raises(SweepError) as refused:
        run_sweep(plan, tracking_uri=uri, storage_path=results, out=io.StringIO(), verbose=0, resume=True)
    message = str(refused.value)
    assert f"cannot resume {b}: the experiment state it would restore, {copied}, holds trials of another " \
           f"experiment folder, {a} " in message
    assert listing(b) == before
    assert MlflowClient(uri).search_runs([e.experiment_id for e in MlflowClient(uri).search_experiments()]) == []

    from haepo_ray.sweep.runner import refuse_a_foreign_state

    moved = tmp_path / "moved" / a.name  # a run folder moved whole keeps its name: Tune follows it
    shutil.copytree(a, moved)
    refuse_a_foreign_state(str(moved), a.name, tune_restore.newest_state_file(str(moved)))


def test_a_resume_with_a_changed_spec_is_refused_naming_the_changes(ray_session, tmp_path, monkeypatch):
    """Tune resumes a run as it started: a longer stop or another grid would be ignored
    without a word. Refused, before Ray starts or anything is written; a new description, another Ray, or a
    run's spec.yaml without a key an older haepo-ray did not write (its default) resume."""
    monkeypatch.chdir(tmp_path)
    results = str(tmp_path / "results")
    data = tiny("changed", 1, search_space={"seed": {"grid": [0]}})
    run_dir = Path(run_sweep(parse_plan(data, "changed.yaml"), track=False, storage_path=results,
                             out=io.StringIO(), verbose=0).run_dir)
    before = listing(run_dir)
    changed = {**data, "stop": {"iterations": 2}, "search_space": {"seed": {"grid": [0, 1]}}}
    with monkeypatch.context() as before_ray:  # refused, as is a resume of nothing, before Ray starts
        before_ray.setattr(runner, "init_ray", lambda *args: pytest.fail("Ray started"))
        with pytest.raises(SweepError, match=f"^nothing to resume under {tmp_path / 'none' / 'changed'}: "):
            run_sweep(parse_plan(data, "changed.yaml"), track=False, storage_path=str(tmp_path / "none"),
                      out=io.StringIO(), verbose=0, resume=True)
        with pytest.raises(SweepError) as refused:
            run_sweep(parse_plan(changed, "changed.yaml"), track=False, storage_path=results, out=io.StringIO(),
                      verbose=0, resume=True)
    assert f"cannot resume {run_dir} with this spec: it changed since the sweep started " \
           "(search_space.seed.grid: [0] -> [0, 1]; stop.iterations: 1 -> 2). Ray Tune resumes" in str(refused.value)
    assert listing(run_dir) == before

    started = run_dir / "spec.yaml"
    started.write_text(started.read_text().replace("keep_checkpoints: null\n", ""))
    same = {**data, "description": "now described", "ray": {"num_cpus": 1}}
    result = run_sweep(parse_plan(same, "changed.yaml"), track=False, storage_path=results, out=io.StringIO(),
                       verbose=0, resume=True)
    assert [(t.status, t.iterations) for t in result.trials] == [("TERMINATED", 1)]


def test_a_run_stopped_before_tunes_first_save_is_refused_before_ray_starts(tmp_path, monkeypatch):
    """A sweep stopped after its Tuner was made (tuner.pkl, which ``--resume`` looks for) and before
    Tune saved an experiment state: Tune's restore would fail after Ray's start; refused before it."""
    from ray import tune

    plan = parse_plan(tiny("early", 1), "early.yaml")
    results = tmp_path / "results"
    run_dir = results / "early" / "20261206-120000-abcdef"
    tune.Tuner(lambda config: None, run_config=tune.RunConfig(name=run_dir.name, storage_path=str(run_dir.parent)))
    before = listing(run_dir)
    monkeypatch.setattr(runner, "init_ray", lambda *args: pytest.fail("Ray started"))
    with pytest.raises(SweepError) as refused:
        run_sweep(plan, track=False, storage_path=str(results), out=io.StringIO(), verbose=0, resume=True)
    assert str(refused.value) == (f"cannot resume {run_dir}: Ray Tune saved no state of that sweep (it was stopped "
                                  "before its first save), so there is nothing to continue: run it anew without "
                                  "--resume")
    assert listing(run_dir) == before


# Slow tier: from scratch (every checkpoint gone), which the killed driver below also meets.
@pytest.mark.parametrize("deleted", ["newest", pytest.param("every", marks=pytest.mark.slow)])
def test_a_trial_whose_newest_checkpoint_is_gone_restarts_from_one_that_exists(deleted, ray_session, tmp_path,
                                                                               monkeypatch):
    """A trial fails (an env raising once), its newest checkpoint is deleted, and the sweep is
    resumed: it restores from its older checkpoint (or, with none left, starts from scratch),
    not from the one that is gone (which failed it again, and every retry)."""
    from ray.tune.registry import register_env

    monkeypatch.chdir(tmp_path)
    register_env("haepo-test/FlakyChain-v0", _flaky_env)
    marker = tmp_path / "failed"
    plan = parse_plan(tiny("gone", 8, env="haepo-test/FlakyChain-v0",
                           env_config={"length": 3, "horizon": 5, "fail_at": 50, "marker": str(marker)}), "gone.yaml")
    uri = sqlite_store(tmp_path / "mlflow.db")
    results = str(tmp_path / "results")
    first = run_sweep(plan, tracking_uri=uri, storage_path=results, out=io.StringIO(), verbose=0)
    assert marker.exists() and [t.status for t in first.trials] == ["ERROR"]
    (trial_dir,) = {c.parent for c in Path(first.run_dir).glob("*/checkpoint_*")}
    checkpoints = sorted(trial_dir.glob("checkpoint_*"))
    assert len(checkpoints) >= 2
    for checkpoint in checkpoints[-1:] if deleted == "newest" else checkpoints:
        shutil.rmtree(checkpoint)

    result = run_sweep(plan, tracking_uri=uri, storage_path=results, out=io.StringIO(), verbose=0, resume=True)
    (trial,) = result.trials
    assert (trial.status, trial.iterations) == ("TERMINATED", 8)
    last = result.result_grid[0].metrics
    restored_at = last["training_iteration"] - last["iterations_since_restore"]
    assert restored_at == (len(checkpoints) - 1 if deleted == "newest" else 0)
    check_each_step_once(uri, "gone", 8)


# Slow tier (19 s on an idle 2-core machine, 33 s beside other work): one driver process more.
@pytest.mark.slow
def test_keep_one_checkpoint_killed_while_the_state_names_a_deleted_one(ray_session, tmp_path, monkeypatch, capfd,
                                                                       caplog):
    """``keep_checkpoints: 1``: Tune deletes a trial's checkpoint when it registers the next, and
    copies the state naming the next one later; the driver is SIGKILLed in between (stopped
    until the state on storage is seen to name a checkpoint that is gone), then resumed."""
    db, uri, results, args = killed_sweep(tmp_path, tiny("keep1", 30, keep_checkpoints=1, max_failures=1),
                                          ray_session.get_runtime_context().gcs_address)

    def names_a_deleted_checkpoint() -> bool:
        for run_dir in results.glob("keep1/*"):
            state = tune_restore.newest_state_file(str(run_dir))
            trials = tune_restore.state_trials(str(run_dir), state) if state else None
            if trials and any(t.checkpoint and not Path(t.checkpoint).exists() for t in trials):
                return True
        return False

    kill_driver_when(args, tmp_path, lambda: metric_rows(db, "time_total_s") >= 2 and names_a_deleted_checkpoint(),
                     paused=True)
    monkeypatch.chdir(tmp_path)
    resume_driver(args, monkeypatch, capfd)
    assert "is not on storage" in caplog.text  # the trial restarted without its deleted checkpoint

    (run_dir,) = results.glob("keep1/*")
    trials = json.loads((run_dir / "haepo_summary.json").read_text())["trials"]
    assert [(t["status"], t["iterations"]) for t in trials] == [("TERMINATED", 30)]
    check_each_step_once(uri, "keep1", 30)


# Slow tier: an mlflow server started twice (20-40 s each on 2 cores).
@pytest.mark.slow
def test_a_sweep_started_while_mlflow_is_down_is_logged_by_its_resume(ray_session, tmp_path, monkeypatch):
    """Nothing can be logged while the server is down: the sweep trains, and its summary says
    how to log it; ``--resume`` once the server answers creates the parent and the trial's run
    from the trial's folder, every step once."""
    monkeypatch.chdir(tmp_path)
    for name, value in {"HAEPO_MLFLOW_RETRIES": "1", "HAEPO_MLFLOW_BACKOFF_S": "0.1"}.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "server").mkdir()
    server = MLflowServer(tmp_path / "server")
    server.stop()
    plan = parse_plan(tiny("down", 3), "down.yaml")
    results = str(tmp_path / "results")
    out = io.StringIO()
    try:
        first = run_sweep(plan, tracking_uri=server.uri, storage_path=results, out=out)
        assert first.parent_run_id is None and [(t.status, t.iterations) for t in first.trials] == [("TERMINATED", 3)]
        assert f"MLflow at {server.uri} was not reached: nothing was logged. Once it answers, run this sweep " \
               "again with --resume" in out.getvalue()
        server.start()
        resumed = run_sweep(plan, tracking_uri=server.uri, storage_path=results, out=io.StringIO(), verbose=0,
                            resume=True)
        assert resumed.parent_run_id is not None and resumed.run_dir == first.run_dir
        check_each_step_once(server.uri, "down", 3)
    finally:
        server.kill()
