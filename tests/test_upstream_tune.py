"""In a sweep of short trials Tune keeps the actors it launches (a cached actor never takes the
trial of an actor that is already starting, whose start would be thrown away), every trial
still runs once, and a finished trial's running statistics are let go. The experiment's folder
gets each file whole or not at all, and a resume refuses a cut-short experiment state. Tune's
staged state is replaced whole, and a copy that left it behind is reported as not synced. A
trial whose process Ray's memory monitor kills is retried, and the sweep goes on."""

from __future__ import annotations

import fnmatch
import io
import json
import os
import shutil
import sys
from pathlib import Path

import psutil
import pytest
from helpers import run_tree
from ray.tune.execution.tune_controller import TuneController

from haepo_ray.upstream import tune as tune_private
from haepo_ray.upstream import tune_storage
from haepo_ray.sweep.results import TrialRecorder
from haepo_ray.sweep.kinds import parse_plan
from haepo_ray.sweep.runner import SweepError, run_sweep

TRIALS = 12


def short_trials() -> dict:
    """One-iteration bandit trials: far shorter than a trial actor's start."""
    return {
        "name": "short", "algorithm": "HAEPO", "env": "haepo/GaussianBandit-v0", "env_config": {"num_arms": 4},
        "settings": {"num_env_runners": 0, "batch_size": 4, "model_config": {"fcnet_hiddens": [8]}},
        "search_space": {"seed": {"grid": list(range(TRIALS))}}, "search": {"algorithm": "grid"},
        "metric": "env_runners/episode_return_mean", "mode": "max", "stop": {"iterations": 1},
        "resources": {"cpus": 1, "gpus": 0}, "reuse_actors": True, "checkpoint_frequency": 0,
        "checkpoint_at_end": False, "max_failures": 0,
    }


def test_a_sweep_of_short_trials_kills_no_actor_while_it_starts(ray_session, tmp_path, monkeypatch):
    """The race: a trial ends (its actor is cached) while the actor launched for a pending trial
    is still starting; unpatched, Tune gives that trial the cached actor and kills the starting
    one. Its interleaving cannot be forced from outside Tune's scheduling (it is the actors'
    start, seconds of imports, against one-iteration trials); the test asserts that it happened:
    some trial offered a cached actor had its own actor starting (``asked``), and no actor Tune
    removed was starting (``removed``). A run in which the race did not occur proves nothing of
    the patch, and says so (a skip), after the checks that hold either way."""
    synced = []  # files copied into the experiment's folder by each patched sync
    sync_folder = tune_storage.sync_folder
    monkeypatch.setattr(tune_storage, "sync_folder", lambda **kw: synced.append(sync_folder(**kw)) or synced[-1])
    removed = []  # for each actor Tune removed: was it starting?
    remove_actor, launching = TuneController._remove_actor, tune_private.launching

    def recording_remove(self, tracked_actor, *args, **kwargs):
        removed.append(launching(self, tracked_actor))
        return remove_actor(self, tracked_actor, *args, **kwargs)

    asked = []  # each time the patch checks a trial offered a cached actor: was its own actor starting?
    monkeypatch.setattr(tune_private, "launching", lambda *a: asked.append(launching(*a)) or asked[-1])

    monkeypatch.setattr(TuneController, "_remove_actor", recording_remove)
    recorder = TrialRecorder()
    result = run_sweep(parse_plan(short_trials(), "short.yaml"), track=False, storage_path=str(tmp_path),
                       out=io.StringIO(), verbose=0, extra_callbacks=[recorder])
    assert sorted(t.values["seed"] for t in result.trials) == list(range(TRIALS))
    assert all(t.status == "TERMINATED" and t.iterations == 1 for t in result.trials)
    assert removed and not any(removed), f"{sum(removed)} of {len(removed)} removed actors were starting"

    for trial in recorder.trials:  # released: no deques, no second config; the statistics stay
        assert trial.run_metadata.metric_n_steps == {}
        assert trial.last_result["config"] is trial.config
        assert trial.metric_analysis["training_iteration"]["last"] == 1
        assert '"metric_n_steps": {}' in trial.run_metadata.get_json_state()
    assert {r.metrics["config"]["seed"] for r in result.result_grid} == set(range(TRIALS))

    # The experiment's folder was written by the patched copy, every trial's results whole in it.
    assert synced and sum(synced) >= TRIALS
    run_dir = Path(result.result_grid.experiment_path)
    state = json.loads(next(run_dir.glob("experiment_state-*.json")).read_text())
    assert len(state["trial_data"]) == TRIALS
    rows = [json.loads(line) for f in run_dir.glob("*/result.json") for line in f.read_text().splitlines()]
    assert sorted(row["config"]["seed"] for row in rows) == list(range(TRIALS))
    assert not list(run_dir.rglob(".*.tmp"))

    # A resume of a run whose newest experiment state is cut short is refused; nothing starts.
    newest = max(run_dir.glob("experiment_state-*.json"))
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    folders = sorted(p.name for p in run_dir.iterdir())
    with pytest.raises(SweepError, match=r"cannot resume .*could not restore it from .*experiment_state-.*"
                                          r"\(JSONDecodeError: "):
        run_sweep(parse_plan(short_trials(), "short.yaml"), track=False, storage_path=str(tmp_path),
                  out=io.StringIO(), verbose=0, resume=True)
    assert sorted(p.name for p in run_dir.iterdir()) == folders

    # Last, what only a run with the race proves: a trial offered a cached actor while its own
    # was starting (150 of 160 checks in a run here), and the patch kept that actor.
    if not any(asked):
        pytest.skip(f"the race did not occur in this run ({len(asked)} checks): the patch was not put to the test")


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_sync_folder_copies_what_changed_each_file_whole(tmp_path):
    source, destination, copied = tmp_path / "staging", tmp_path / "experiment", {}
    (source / "trial_0").mkdir(parents=True)
    (source / "trial_1").mkdir()
    (source / "experiment_state-1.json").write_text('{"trial_data": [1]}')
    (source / "trial_0" / "result.json").write_text('{"i": 1}\n')
    (source / ".0123-tmp-basic-variant-state-1.json").write_text("half")  # Tune's own temporary
    assert tune_storage.sync_folder(str(source), str(destination), copied) == 2
    assert tree(destination) == {"experiment_state-1.json": b'{"trial_data": [1]}',
                                 "trial_0/result.json": b'{"i": 1}\n'}
    assert (destination / "trial_1").is_dir()
    assert tune_storage.sync_folder(str(source), str(destination), copied) == 0

    with open(source / "trial_0" / "result.json", "a") as f:
        f.write('{"i": 2}\n')
    assert tune_storage.sync_folder(str(source), str(destination), copied) == 1
    assert tree(destination)["trial_0/result.json"] == b'{"i": 1}\n{"i": 2}\n'


def test_a_copy_cut_short_leaves_the_old_file_and_nothing_tune_reads(tmp_path, monkeypatch):
    source, destination, copied = tmp_path / "staging", tmp_path / "experiment", {}
    source.mkdir()
    state = source / "experiment_state-1.json"
    state.write_text('{"trial_data": [1]}')
    tune_storage.sync_folder(str(source), str(destination), copied)
    state.write_text('{"trial_data": [1, 2, 3]}')

    def killed_halfway(src, dst):
        Path(dst).write_bytes(Path(src).read_bytes()[:10])
        raise KeyboardInterrupt  # the thread dies where a SIGKILL would stop it

    monkeypatch.setattr(shutil, "copyfile", killed_halfway)
    with pytest.raises(KeyboardInterrupt):
        tune_storage.sync_folder(str(source), str(destination), copied)
    assert (destination / "experiment_state-1.json").read_text() == '{"trial_data": [1]}'
    assert fnmatch.filter(os.listdir(destination), TuneController.CKPT_FILE_TMPL.format("*")) \
        == ["experiment_state-1.json"]

    rewrites = []

    def rewritten_meanwhile(src, dst):  # Tune's next save lands while the copy runs
        Path(dst).write_bytes(Path(src).read_bytes())
        Path(src).write_text('{"trial_data": [1, 2, 3, 4]}')
        rewrites.append((src, dst))

    monkeypatch.setattr(shutil, "copyfile", rewritten_meanwhile)
    assert tune_storage.sync_folder(str(source), str(destination), copied) == 0
    assert (destination / "experiment_state-1.json").read_text() == '{"trial_data": [1]}'
    # The race happened: the state was copied once, into the temporary, and changed meanwhile;
    # the copy was thrown away (and with it what the cut-short copy above had left there).
    assert rewrites == [(str(state), str(destination / ".experiment_state-1.json.tmp"))]
    assert sorted(os.listdir(destination)) == ["experiment_state-1.json"]
    monkeypatch.undo()
    assert tune_storage.sync_folder(str(source), str(destination), copied) == 1
    assert (destination / "experiment_state-1.json").read_text() == '{"trial_data": [1, 2, 3, 4]}'


def test_a_copy_that_left_the_state_behind_is_not_reported_as_synced(tmp_path, monkeypatch):
    """Tune counts a launched copy as synced and stops forcing the next (with keep_checkpoints,
    ray-project/ray#27790); a copy that left the experiment state behind is reported as not
    synced, so Tune forces another."""
    import threading

    import pyarrow.fs
    from ray.train._internal.storage import _FilesystemSyncer

    tune_private.FILES_COPIED_WHOLE.apply()
    source, destination = tmp_path / "staging", tmp_path / "experiment"
    source.mkdir()
    state = source / "experiment_state-1.json"
    state.write_text('{"trial_data": [1]}')
    syncer = _FilesystemSyncer(storage_filesystem=pyarrow.fs.LocalFileSystem())
    copyfile, release = shutil.copyfile, threading.Event()

    def replaced_meanwhile(src, dst):  # Tune's next save lands while the copy runs
        copyfile(src, dst)
        Path(f"{src}.next").write_text('{"trial_data": [1, 2]}')
        os.replace(f"{src}.next", src)

    def held(src, dst):  # a copy still running when Tune asks
        release.wait(30)
        copyfile(src, dst)

    monkeypatch.setattr(shutil, "copyfile", replaced_meanwhile)
    syncer.sync_up(str(source), str(destination))
    syncer.wait()
    assert (destination / state.name).read_text() == '{"trial_data": [1]}'  # a whole earlier version
    monkeypatch.setattr(shutil, "copyfile", held)
    assert syncer.sync_up(str(source), str(destination)) is False  # the copy before left it behind
    release.set()
    syncer.wait()
    assert (destination / state.name).read_text() == '{"trial_data": [1, 2]}'
    release.clear()
    assert syncer.sync_up(str(source), str(destination)) is True  # it is on storage now
    release.set()
    syncer.wait()


def test_the_staged_state_is_replaced_whole_and_a_checkpoint_deleted_whole(ray_session, tmp_path):
    """Tune writes its experiment state into the staging folder in place, which a copy running
    meanwhile could take half-written: it is written under a temporary name and renamed over
    (a new file each time). A checkpoint Tune deletes leaves no folder behind."""
    from ray import tune

    tune_private.apply()
    inodes, temporaries = set(), set()

    class Look(tune.Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            folder = Path(trial.storage.experiment_driver_staging_path)
            inodes.update(p.stat().st_ino for p in folder.glob("experiment_state-*.json"))
            temporaries.update(p.name for p in folder.glob(".experiment_state-*"))

    def trainable(config):
        for i in range(6):
            folder = Path(tune.get_context().get_trial_dir()) / f"local_{i}"
            folder.mkdir()
            (folder / "weights").write_text(str(i))
            tune.report({"i": i}, checkpoint=tune.Checkpoint.from_directory(str(folder)))

    result = tune.Tuner(trainable, run_config=tune.RunConfig(
        name="whole", storage_path=str(tmp_path), verbose=0, callbacks=[Look()],
        checkpoint_config=tune.CheckpointConfig(num_to_keep=1))).fit()
    assert len(inodes) > 1, "the staged state was written in place"
    assert not temporaries
    (trial_dir,) = {p.parent for p in (tmp_path / "whole").glob("*/checkpoint_*")}
    assert sorted(p.name for p in trial_dir.iterdir() if "checkpoint" in p.name) == ["checkpoint_000005"]
    assert result[0].checkpoint.path == str(trial_dir / "checkpoint_000005")


# A Tune run of two trials, "greedy" (which holds more and more memory on its first attempt)
# and "calm", with the sweep's patches installed (haepo_ray.upstream.tune.apply, as run_sweep
# does) and a Ray whose memory monitor kills at the threshold the test sets.
KILLED_FOR_MEMORY = """
import json, os, sys, time
import psutil, ray
from ray import tune
from haepo_ray.upstream import tune as tune_private

tune_private.apply()
folder, most = sys.argv[1], int(sys.argv[2])  # the machine's use (bytes) the monitor cannot have let by
ray.init(num_cpus=2, include_dashboard=False)

def trial(config):
    first = os.path.join(folder, config["name"] + ".first")
    if config["name"] == "greedy" and not os.path.exists(first):
        open(first, "w").close()
        held = []
        while (used := (m := psutil.virtual_memory()).total - m.available) < most:
            held.append(bytearray(256 * 2**20))  # written: resident
            time.sleep(0.2)
        raise RuntimeError(f"the memory monitor let the machine use {used / 2**30:.1f} GiB (this trial "
                           f"{len(held) / 4:.2f} GiB)")
    tune.report({"done": 1})

tuner = tune.Tuner(trial, param_space={"name": tune.grid_search(["greedy", "calm"])},
                   run_config=tune.RunConfig(storage_path=os.path.join(folder, "ray"),
                                             failure_config=tune.FailureConfig(max_failures=3)))
print(json.dumps({r.config["name"]: [r.error is None, r.metrics.get("done")] for r in tuner.fit()}))
"""


@pytest.mark.slow
def test_a_trial_killed_for_memory_is_retried_and_the_sweep_goes_on(tmp_path):
    """Unpatched, Tune 2.60 ends the run with ``RuntimeError: Caught unexpected exception`` when
    the monitor kills a trial's process; patched, the trial fails, is retried and finishes, and
    so does the other. The monitor watches the whole machine, so its threshold is set 5 GiB above
    what the machine uses now: with 1.5 GiB, another test's process growing by 2 GiB (a Ray, a
    language-model trial) crossed it alone, and the monitor killed this run's trials past their 3
    retries. The greedy trial stops, and says so, if nothing killed it once the machine uses 1.5 GiB
    past the threshold (the machine's use, not its own: another process may free memory meanwhile)."""
    memory = psutil.virtual_memory()
    threshold = memory.total - memory.available + 5 * 2**30
    env = {**os.environ, "RAY_memory_usage_threshold": f"{threshold / memory.total:.4f}",
           "RAY_memory_monitor_refresh_ms": "100"}
    script = tmp_path / "killed_for_memory.py"
    script.write_text(KILLED_FOR_MEMORY)
    done = run_tree([sys.executable, str(script), str(tmp_path), str(int(threshold + 1.5 * 2**30))],
                    env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"greedy": [True, 1], "calm": [True, 1]}, \
        done.stderr[-3000:]
    assert "OutOfMemoryError" in done.stderr or "running low on memory" in done.stderr, done.stderr[-3000:]
