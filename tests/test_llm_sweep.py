"""Language-model sweeps end to end in ``haepo sweep``: trials in their own process and
trials of Ray Train ``TorchTrainer`` workers.

- tune_configs/llm_smoke.yaml (HAEPO, GRPO, DPO x 2 seeds on the tiny LM, each trial in its
  own process) against a real ``mlflow server``: one parent, one child per trial with its
  algorithm and model tags, every update's metrics once, generations.jsonl at the run's root
  and the final checkpoint;
- a trial killed mid-run and resumed from its checkpoint, on 2 Ray Train CPU workers (gloo)
  and in its own process (slow tier), and a sweep whose driver is killed and resumed, end with
  the weights of one process trained uninterrupted, each update in MLflow once, its checkpoint
  and generations logged;
- spec errors name the key;
- a finished trial gives the memory it freed back to the OS (its process is reused).
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import platform
import signal
import tempfile
import threading
import time
from pathlib import Path

import mlflow
import psutil
import pytest
import torch
import yaml
from helpers import MLflowServer, sqlite_store
from mlflow.tracking import MlflowClient
from sweep_checks import check_cpu_devices, check_provenance

from haepo_ray import names
from haepo_ray.llm.sft_start import MARKER, start_key
from haepo_ray.report.generations import JUDGES
from haepo_ray.sweep.cluster import Cluster
from haepo_ray.sweep.kinds.llm.fit import config_memory_key
from haepo_ray.sweep.kinds.llm.trainable import SCRATCH_PREFIX
from haepo_ray.sweep.kinds import load_plan, parse_plan
from haepo_ray.sweep.trial_process import release_memory
from haepo_ray.sweep.trial_scratch import LOCK_SUFFIX
from haepo_ray.sweep.runner import run_sweep
from haepo_ray.sweep.spec import SpecError
from haepo_ray.tracking import find_sweep_runs

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "tune_configs" / "llm_smoke.yaml"
UPDATE_METRICS = (names.LLM_REWARD, names.LLM_ROUGE_L, names.LLM_SEMANTIC_SIMILARITY, names.LLM_PROFANITY_RATE,
                  names.LLM_COMPLETION_LENGTH, names.LLM_EFFECTIVE_NUM_TRAJECTORIES, names.LLM_KL,
                  names.LLM_UPDATE_TIME, names.LLM_TRAIN_TIME, f"{names.LLM_PHASE_TIME}/load",
                  f"{names.LLM_PHASE_TIME}/eval", f"{names.LLM_PEAK_MEMORY}/generation",
                  f"{names.LLM_PEAK_MEMORY}/forward_backward", f"{names.LLM_PEAK_RESERVED_MEMORY}/forward_backward")
EVAL_METRICS = (*(names.llm_eval(metric, mode) for mode in names.LLM_EVAL_MODES for metric in names.LLM_EVAL_METRICS),
                *(names.llm_eval(metric, names.LLM_EVAL_POLICY) for metric in names.LLM_EVAL_POLICY_METRICS))


def smoke_spec(**changes) -> dict:
    """llm_smoke.yaml with ``changes``: ``llm`` and ``settings`` are updated, other keys replaced."""
    spec = yaml.safe_load(SMOKE.read_text())
    for key, value in changes.items():
        spec[key] = {**spec[key], **value} if key in ("llm", "settings") else value
    return spec


def update_history(client: MlflowClient, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


@pytest.fixture(scope="module")
def smoke(ray_session, tmp_path_factory):
    """tune_configs/llm_smoke.yaml run once against a real ``mlflow server`` (kept up for the
    module's tests): (server, result, folder)."""
    folder = tmp_path_factory.mktemp("llm_smoke")
    cwd = os.getcwd()
    os.chdir(folder)
    server = MLflowServer(folder)
    try:
        result = run_sweep(load_plan(SMOKE), tracking_uri=server.uri, storage_path=str(folder / "results"),
                           out=io.StringIO(), verbose=0)
        yield server, result, folder
    finally:
        server.kill()
        os.chdir(cwd)


def test_llm_smoke_sweep_lands_nested_runs_with_every_update(smoke):
    server, result, folder = smoke
    client = MlflowClient(server.uri)
    parent, children = find_sweep_runs(server.uri, "llm_smoke", result.parent_run_id)
    updates = yaml.safe_load(SMOKE.read_text())["settings"]["rl_updates"]
    assert [t.status for t in result.trials] == ["TERMINATED"] * 6
    assert all(t.iterations == updates for t in result.trials)
    assert not result.not_logged and result.missing_metric is None
    assert parent.data.tags[names.MODEL] == "tiny" and parent.data.params["llm/num_workers"] == "0"
    assert parent.info.status == "FINISHED"
    assert len(children) == 6
    plan = load_plan(SMOKE).fitted(Cluster.unknown())
    seen, sft_seconds = set(), {}
    for child in children:
        tags, params = child.data.tags, child.data.params
        # Every method of a seed began RL from one SFT start, made once: the loaders' clocks
        # hold its maker's SFT seconds to the bit, which no second SFT would measure.
        assert tags[names.SFT_START] == start_key(plan.trial_config({"algorithm": params["algo"],
                                                                     "seed": int(tags[names.SEED])}))
        (first, *_) = client.get_metric_history(child.info.run_id, f"{names.LLM_PHASE_TIME}/sft")
        sft_seconds.setdefault(tags[names.SEED], set()).add((tags[names.SFT_START], first.value))
        assert tags[names.ROLE] == "trial" and tags[names.PARENT_RUN] == parent.info.run_id
        assert tags[names.ALGORITHM] == params["algo"] and tags[names.MODEL] == "tiny"
        check_provenance(tags)
        check_cpu_devices(tags, "policy")
        seen.add((tags[names.ALGORITHM], tags[names.SEED]))
        assert params["ray_train/num_workers"] == "0" and params["rl_updates"] == str(updates)
        # its GPU memory estimate (llm.gpu_memory_gb is set), next to the measured peaks
        estimate = plan.fit.estimates[config_memory_key(plan.trial_config({"algorithm": params["algo"]}).__dict__)]
        assert float(params["gpu_memory/estimated_peak_gib"]) == round(estimate.peak_gib, 3) > 0
        assert params["gpu_memory/peak_phase"] == estimate.phase and params["gpu_memory/limit_gib"] == "40.0"
        for key in UPDATE_METRICS:
            assert update_history(client, child.info.run_id, key) == list(range(1, updates + 1)), key
        assert 0 <= child.data.metrics[names.LLM_REWARD] <= 1
        for key in EVAL_METRICS:  # the held-out evaluation after the last update (eval_every 0)
            assert update_history(client, child.info.run_id, key) == [updates], key
        assert 0 <= child.data.metrics[names.llm_eval(names.LLM_REWARD, "sampled")] <= 1
    assert seen == {(a, s) for a in ("HAEPO", "GRPO", "DPO") for s in ("0", "1")}
    assert [len(v) for v in sft_seconds.values()] == [1, 1], sft_seconds
    starts = sorted(p.parent.name for p in (folder / "results").rglob(f"sft_starts/*/{MARKER}"))
    assert starts == sorted(key for (key, _), in sft_seconds.values())
    # generations.jsonl at the run's root (the evaluation form reads it), beside the checkpoint.
    artifacts = folder / "artifacts"
    generations = [p for p in artifacts.rglob("generations.jsonl") if p.parent.name == "artifacts"]
    assert len(generations) == 6
    rows = [json.loads(line) for line in generations[0].read_text().splitlines()]
    assert rows and {r["model"] for r in rows} == {"tiny"} and {r["update"] for r in rows} == {updates}
    assert all({"token_f1", "semantic_similarity", "length_closeness", "rouge_l", "kl_exact"} <= set(r) for r in rows)
    assert len(list(artifacts.rglob("checkpoint/state.pt"))) == 6
    best = max(children, key=lambda r: r.data.metrics[names.LLM_REWARD])
    assert parent.data.tags[names.BEST_RUN_ID] == best.info.run_id


def test_eval_form_from_the_smoke_sweep(smoke, tmp_path, capsys):
    """Every seed holds out the same prompts, so the form finds posts every algorithm answered."""
    server, _, _ = smoke
    from haepo_ray.cli import main

    assert main(["llm", "eval-form", "--experiment", "llm_smoke", "--tracking-uri", server.uri,
                 "--out", str(tmp_path / "eval"), "--posts", "2", "--seed", "0"]) == 0
    for seed in (0, 1):  # one form per training seed, every system of it from that seed
        form = (tmp_path / "eval" / f"form-seed{seed}.html").read_text()
        with (tmp_path / "eval" / f"key-seed{seed}.csv").open() as f:
            key = list(csv.DictReader(f))
        assert {row["algorithm"] for row in key} == {"HAEPO", "GRPO", "DPO"} and len(key) == 6
        assert {row["seed"] for row in key} == {str(seed)}
        assert not any(row["run_id"] in form for row in key) and "HAEPO" not in form


def test_report_of_the_smoke_sweep(smoke, tmp_path):
    """haepo report reads the real sweep: one row per algorithm, 2 seeds, every update."""
    from haepo_ray.report import build_report

    server, result, _ = smoke
    report = build_report(server.uri, ["llm_smoke"], tmp_path / "report")
    rows = {r["algorithm"]: r for _, r in report.table.iterrows()}
    assert sorted(rows) == ["DPO", "GRPO", "HAEPO"]
    updates = yaml.safe_load(SMOKE.read_text())["settings"]["rl_updates"]
    client = MlflowClient(server.uri)
    _, children = find_sweep_runs(server.uri, "llm_smoke", result.parent_run_id)
    for algorithm, row in rows.items():
        assert (row["model"], row["seeds"], row["updates"]) == ("tiny", 2, updates), algorithm
        # The held-out greedy reward at the last update, not the training samples' (the sweep's metric).
        finals = [max(client.get_metric_history(c.info.run_id, names.llm_eval(names.LLM_REWARD)), key=lambda m: m.step).value
                  for c in children if c.data.params["algo"] == algorithm]
        assert len(finals) == 2 and row["reward mean"] == pytest.approx(sum(finals) / 2), algorithm
    assert any("memory" in fig.stem for fig in report.figures)
    # generations.jsonl read through the server: every ordered pair of methods, by every judge, on both seeds
    assert len(report.win_rates) == len(JUDGES) * 6 and set(report.win_rates["win rate"].map(lambda r: r.n)) == {2}
    assert all((tmp_path / "report" / f"{fig.stem}.png").exists() for fig in report.figures)
    assert "llm_smoke" in (tmp_path / "report" / "index.html").read_text()


def _processes_of_this_ray(title: str) -> list[int]:
    """PIDs of this test's Ray's workers (children of its raylet, whose command line names this
    worker's Ray folder) whose process title holds ``title``, not of any other Ray on the machine."""
    import psutil

    from conftest import ray_temp_dir

    pids = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if title in " ".join(proc.info["cmdline"] or []) and \
                    ray_temp_dir() in " ".join(proc.parent().cmdline()):
                pids.append(proc.pid)
        except (psutil.Error, AttributeError):  # gone meanwhile, or no parent
            continue
    return pids


class KillAt:
    """Kills the processes that train the trial (SIGKILL) once it has checkpointed update ``at``."""

    def __init__(self, results: Path, at: int, title: str):
        self.results, self.at, self.title, self.killed = results, at, title, False
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not self.killed:
            if newest_checkpoint(self.results) >= self.at:
                for pid in _processes_of_this_ray(self.title):
                    os.kill(pid, signal.SIGKILL)
                    self.killed = True
            time.sleep(0.2)


def newest_checkpoint(results: Path) -> int:
    """The highest update checkpointed under ``results`` (0: none yet)."""
    updates = [0]
    for state in results.rglob("checkpoint_*/state.pt"):
        try:
            updates.append(torch.load(state, weights_only=True)["update"])
        except Exception:  # still being written
            continue
    return max(updates)


UPDATES = 8  # the kill lands after the update-2 checkpoint; a tiny update takes a fraction of a second
# What trains a trial: its Ray Train workers, or (num_workers: 0) Tune's trial actor itself.
TRAINS = {2: "RayTrainWorker", 0: "ImplicitFunc"}


# Slow tier, both cases. The Ray Train case: a controller and about seven actors per start, two
# starts, the workers importing transformers (about 120 CPU-seconds). The trial's own process:
# the claim is in the test command twice over: the killed driver below restores the trial from
# its checkpoint into a new actor (the same restore) and ends with the weights of one process,
# each update logged once although the restored trial repeats some; test_multinode's node loss
# has Tune retry a failed trial from its checkpoint (max_failures) into one MLflow run.
@pytest.mark.slow
@pytest.mark.parametrize("workers", [2, 0])
def test_a_killed_trial_trains_what_one_process_trains_uninterrupted(workers, ray_session, tmp_path, monkeypatch):
    """Killed after its update-2 checkpoint and retried by Tune from it, a trial ends with the
    weights and losses of one process trained uninterrupted on the same prompts (an LLMRun
    here), and MLflow gets every update once and the final checkpoint with the generations at
    the run's root: on 2 Ray Train workers (a worker killed; whole prompt groups per worker,
    gradients summed, Train's checkpoint) and in the trial's own process (num_workers: 0; the
    trial actor killed, Tune's checkpoint).

    The reward leaves out the MiniLM similarity: its float32 embeddings of differently batched
    texts differ in the 7th digit, which Adam turns into 1e-5 steps where gradients are ~0."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    name = f"workers{workers}"
    spec = smoke_spec(name=name, llm={"num_workers": workers, "cpus_per_worker": 0.5}, search_space={},
                      algorithm="HAEPO", max_failures=1, checkpoint_frequency=1,
                      settings={"rl_updates": UPDATES, "sft_examples": 4, "dtype": "float64",
                                "reward_weights": [0.5, 0.0, 0.5]})
    plan = parse_plan(spec, f"{name}.yaml")
    killer = KillAt(tmp_path / "results" / name, at=2, title=TRAINS[workers])
    killer.thread.start()
    result = run_sweep(plan, tracking_uri=uri, storage_path=str(tmp_path / "results"), out=io.StringIO(), verbose=0)
    (trial,) = result.trials
    assert (trial.status, trial.iterations) == ("TERMINATED", UPDATES)
    assert killer.killed, f"no {TRAINS[workers]} was killed"
    assert trial.num_failures == 1
    _, (child,) = find_sweep_runs(uri, name, result.parent_run_id)
    assert_trains_like_one_process(plan, uri, child, tmp_path)


def assert_trains_like_one_process(plan, uri: str, child, tmp_path: Path) -> None:
    """The trial of ``child`` (a finished MLflow run of the one-trial sweep ``plan``) logged
    every update once, its final checkpoint and its generations at the run's root, and ended
    with the weights and losses of one process trained uninterrupted (an LLMRun here)."""
    from haepo_ray.llm.train import LLMRun

    updates = plan.trial_config({}).rl_updates
    assert child.info.status == "FINISHED"
    for key in UPDATE_METRICS:
        assert update_history(MlflowClient(uri), child.info.run_id, key) == list(range(1, updates + 1)), key
    artifacts = {a.path for a in MlflowClient(uri).list_artifacts(child.info.run_id)}
    assert {"generations.jsonl", "checkpoint"} <= artifacts, artifacts
    checkpoint = Path(mlflow.artifacts.download_artifacts(run_id=child.info.run_id, artifact_path="checkpoint",
                                                          tracking_uri=uri, dst_path=str(tmp_path / "logged")))
    two = torch.load(checkpoint / "state.pt", weights_only=True)["model"]
    two_rows = [json.loads(line) for line in (checkpoint / "metrics.jsonl").read_text().splitlines()]

    run = LLMRun(plan.trial_config({}), tmp_path / "one")
    initial = {k: v.clone() for k, v in run.model.state_dict().items()}
    run.sft()
    for _ in run.rl():
        pass
    run.close()
    one, one_rows = run.model.state_dict(), run.rows
    assert one.keys() == two.keys() and one
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=0, atol=1e-9, msg=key)
    # Every SFT step and update once, with the same losses, rewards and KL (Adam would hide a
    # wrong gradient scale in the weights; the reported losses would not); rewards are float32.
    assert [(r["phase"], r["update"]) for r in two_rows] == [(r["phase"], r["update"]) for r in one_rows]
    assert [r["update"] for r in one_rows if r["phase"] == "rl"] == list(range(1, updates + 1))
    for a, b in zip(one_rows, two_rows, strict=True):
        for key in ("loss", "reward_mean", "kl", "completion_length"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-6), (a["phase"], a["update"], key)
    # ... and training moved the weights: the comparison is not between two untrained models.
    assert any(not torch.equal(initial[k], one[k]) for k in one)


@pytest.mark.slow  # the fast tier's killed-driver resume is test_sweep_e2e's (an RL sweep on SQLite)
def test_a_killed_driver_resumes_each_update_once_with_the_weights_of_one_process(ray_session, tmp_path,
                                                                                  monkeypatch, capfd):
    """The driver of a language-model sweep (llm_smoke's shape, one trial) SIGKILLed while its
    trial has logged updates after its newest checkpoint, then ``--resume``: the re-read
    results and the restored trial's repeated updates are not logged again, so MLflow holds
    every (run, metric, step) exactly once, every update of every metric, and the trial ends
    with the weights of one process trained uninterrupted."""
    from drivers import kill_driver_when, logged_rows, metric_rows, resume_driver, sweep_args

    spec = smoke_spec(name="llm_resumable", search_space={}, algorithm="HAEPO", max_failures=0,
                      checkpoint_frequency=RESUME_EVERY,
                      settings={"rl_updates": RESUME_UPDATES, "sft_examples": 4, "dtype": "float64",
                                "reward_weights": [0.5, 0.0, 0.5]})
    spec_path = tmp_path / "llm_resumable.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    db, results = tmp_path / "mlflow.db", tmp_path / "results"
    uri = sqlite_store(db)
    args = sweep_args(spec_path, uri, results, ray_session.get_runtime_context().gcs_address)
    seen = {}

    def between_checkpoints() -> bool:  # MLflow holds updates after the newest checkpoint
        seen.update(checkpoint=newest_checkpoint(results), logged=metric_rows(db, names.LLM_REWARD))
        return 0 < seen["checkpoint"] < seen["logged"] < RESUME_UPDATES

    before = set(NODE_TMP.glob(f"{SCRATCH_PREFIX}*"))
    kill_driver_when(args, tmp_path, between_checkpoints)
    monkeypatch.chdir(tmp_path)
    resume_driver(args, monkeypatch, capfd)
    # The killed trial's scratch folder (its run files, the checkpoint it may have been writing)
    # is removed by the resumed trial (held ones are the living workers' of other tests).
    left = [p.name for p in set(NODE_TMP.glob(f"{SCRATCH_PREFIX}*")) - before
            if p.suffix != LOCK_SUFFIX and not held(Path(f"{p}{LOCK_SUFFIX}"))]
    assert not left, f"the killed trial left {left} in {NODE_TMP}"

    rows = logged_rows(uri, "llm_resumable")
    assert not {k: n for k, n in rows.items() if n > 1}, f"logged more than once (killed at {seen})"
    _, (child,) = find_sweep_runs(uri, "llm_resumable")
    assert int(child.data.tags[names.REPLAYED_STEPS]) >= seen["logged"] - seen["checkpoint"], seen
    assert_trains_like_one_process(parse_plan(spec, "llm_resumable.yaml"), uri, child, tmp_path)


NODE_TMP = Path(tempfile.gettempdir())  # the ray_session's workers' as well


def held(lock: Path) -> bool:
    """Whether a living process holds ``lock`` (an exclusive flock); False where it is missing."""
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


# The kill lands after the checkpoint of update 5 or 10, once MLflow holds a later update. The
# writer logs every 0.5 s; a tiny update takes 0.2 s on a 2-core EPYC: 3 updates between
# checkpoints were too few, MLflow's count went 3, 6, 9 in most runs and the sweep ended unkilled.
RESUME_UPDATES, RESUME_EVERY = 15, 5


@pytest.mark.parametrize(("change", "message"), [
    ({"env": "CartPole-v1"}, "give env (an RL sweep) or llm (a language-model sweep), not both"),
    ({"algorithm": "HAEPO"}, "algorithm (HAEPO, GRPO or DPO) or search_space.algorithm"),
    ({"settings": {"lerning_rate": 0.1}}, "settings.lerning_rate: not a language-model setting"),
    ({"settings": {"model": "smollm2"}}, "settings.model: not a language-model setting (set llm.model)"),
    ({"settings": {"batch_size": 3}, "llm": {"model": "tiny", "num_workers": 2}},
     "must be a multiple of llm.num_workers (2)"),
    ({"settings": {"beta_kl": -1.0}}, "beta_kl must be a finite number >= 0"),
    ({"scheduler": {"type": "pbt", "mutations": {"lr": {"uniform": [0.1, 0.2]}}}}, "use fifo or asha"),
    ({"stop": {"env_steps": 100}}, "stops on iterations (RL updates) or seconds"),
    ({"llm": {"model": "tiny", "gpus_per_worker": 0.5}}, "gpus_per_worker needs use_gpu: true"),
    ({"search_space": {"algorithm": {"grid": ["HAEPO", "DPO"]}, "beta_kl": {"grid": [0.0, 0.1]}}},
     "search_space.beta_kl: DPO trials would ignore it: DPO's loss has no entropy bonus and no KL penalty "
     "(its pull towards the reference policy is dpo_beta); remove beta_kl, or sweep DPO in a spec of its own"),
    ({"search_space": {"algorithm": {"grid": ["HAEPO", "GRPO"]}}, "settings": {"clip_param": 0.1}},
     "settings.clip_param: HAEPO trials would ignore it: it is GRPO's clip of the ratio to the old policy, and that "
     "ratio is 1 unless num_iterations > 1; remove clip_param, or sweep HAEPO in a spec of its own\n"
     "llm.yaml: settings.clip_param: GRPO trials would ignore it"),
    ({"settings": {"lora_alpha": 8.0}}, "settings.lora_alpha: HAEPO trials would ignore it: it sets LoRA's adapters, "
     "and with lora_r 0 there are none (every weight trains); remove lora_alpha\n"),
    # judged with every value searched for what else decides it
    ({"search_space": {"algorithm": {"grid": ["HAEPO", "GRPO"]}, "lora_r": {"grid": [0]}},
      "settings": {"lora_alpha": 8.0}}, "settings.lora_alpha: HAEPO trials would ignore it"),
    ({"algorithm": "GRPO", "search_space": {"num_iterations": {"grid": [1]}}, "settings": {"clip_param": 0.1}},
     "settings.clip_param: GRPO trials would ignore it: it is GRPO's clip of the ratio to the old policy"),
])
def test_llm_spec_errors_name_the_key(change, message):
    spec = yaml.safe_load(SMOKE.read_text())
    spec.update(change)
    with pytest.raises(SpecError) as err:
        parse_plan(spec, "llm.yaml")
    assert message in str(err.value) and "llm.yaml" in str(err.value)


def test_an_asha_that_would_compare_trials_only_at_their_last_update_is_refused():
    """A language-model trial ends after its last RL update (rl_updates, the most any trial
    takes when searched): ASHA's first comparison there or later stops nothing."""
    asha = {"type": "asha", "max_t": 8}
    with pytest.raises(SpecError) as err:
        parse_plan(smoke_spec(scheduler={**asha, "grace_period": 4}), "llm.yaml")
    assert str(err.value) == (
        "llm.yaml: scheduler asha would never act: it first compares trials at scheduler.grace_period (4) "
        "iterations, and settings.rl_updates (4) ends every trial by then (a decision at a trial's last update "
        "stops nothing): lower scheduler.grace_period below 4, or raise settings.rl_updates")
    searched = smoke_spec(scheduler={**asha, "grace_period": 3})
    searched["settings"].pop("rl_updates")
    searched["search_space"]["rl_updates"] = {"grid": [2, 3]}
    with pytest.raises(SpecError, match=r"search_space.rl_updates \(3\) ends every trial by then"):
        parse_plan(searched, "llm.yaml")
    with pytest.raises(SpecError, match=r"settings.rl_updates \(1\) ends .*stops nothing\): raise settings"):
        parse_plan(smoke_spec(scheduler={**asha, "grace_period": 1}, settings={"rl_updates": 1}), "llm.yaml")
    searched["search_space"]["rl_updates"] = {"grid": [2, 4]}  # the 4-update trials are compared at 3
    for spec in (smoke_spec(scheduler={**asha, "grace_period": 3}), searched,
                 smoke_spec(scheduler={**asha, "grace_period": 4}, settings={"rl_updates": 5})):
        assert parse_plan(spec, "llm.yaml").spec.scheduler.type == "asha"


@pytest.mark.parametrize(("change", "values", "expected"), [
    ({"search_space": {"algorithm": {"grid": ["HAEPO", {"GRPO": {"num_iterations": 2, "clip_param": 0.1}}]}}},
     {"algorithm": {"GRPO": {"num_iterations": 2, "clip_param": 0.1}}}, {"algo": "GRPO", "clip_param": 0.1}),
    # lora_r (num_iterations) searched: its trials with adapters (more iterations) read lora_alpha (clip_param)
    ({"search_space": {"lora_r": {"grid": [0, 8]}}, "algorithm": "HAEPO", "settings": {"lora_alpha": 32.0}},
     {"lora_r": 8}, {"lora_r": 8, "lora_alpha": 32.0}),
    ({"search_space": {"num_iterations": {"grid": [1, 2]}}, "algorithm": "GRPO", "settings": {"clip_param": 0.1}},
     {"num_iterations": 2}, {"num_iterations": 2, "clip_param": 0.1}),
])
def test_settings_the_trials_read_are_taken(change, values, expected):
    spec = yaml.safe_load(SMOKE.read_text())
    spec.update(change)
    config = parse_plan(spec, "llm.yaml").trial_config(values)
    assert {name: getattr(config, name) for name in expected} == expected


@pytest.mark.parametrize("algorithm", ["HAEPO", "GRPO", "DPO"])
def test_beta_ent_and_beta_kl_are_refused_for_dpo_trials_only(algorithm):
    """DPO's loss has no entropy bonus or KL penalty: a spec that sets them for DPO trials is an
    error naming the file and each key (the trials would ignore the values MLflow logs); HAEPO
    and GRPO trials take them."""
    spec = smoke_spec(algorithm=algorithm, search_space={"seed": {"grid": [0, 1]}},
                      settings={"beta_ent": 0.02, "beta_kl": 0.05})
    if algorithm != "DPO":
        config = parse_plan(spec, "tldr.yaml").trial_config({})
        assert (config.algo, config.beta_ent, config.beta_kl) == (algorithm, 0.02, 0.05)
        return
    with pytest.raises(SpecError) as err:
        parse_plan(spec, "tldr.yaml")
    assert str(err.value).splitlines() == [
        f"tldr.yaml: settings.{key}: DPO trials would ignore it: DPO's loss has no entropy bonus and no KL "
        f"penalty (its pull towards the reference policy is dpo_beta); remove {key}" for key in ("beta_ent", "beta_kl")]


@pytest.mark.parametrize("spec", [
    smoke_spec(llm={"use_gpu": True}),
    {"algorithm": "HAEPO", "env": "haepo/ChainMDP-v0", "resources": {"cpus": 1, "gpus": 1}, "stop": {"iterations": 1}},
], ids=["language-model", "rl"])
def test_gpu_trials_fail_at_start_on_a_local_ray_without_gpus(ray_session, tmp_path, spec):
    plan = parse_plan(spec, "gpu.yaml")
    with pytest.raises(SpecError, match=r"gpu\.yaml: each trial asks for 1 GPU\(s\) .*, but the embedded local Ray "
                                        r"has none: its trials would wait for ever"):
        run_sweep(plan, track=False, storage_path=str(tmp_path), out=io.StringIO(), verbose=0)
    assert not list(tmp_path.iterdir())  # nothing started


def test_a_relative_data_file_is_read_from_where_the_sweep_starts(tmp_path, monkeypatch):
    """Tune starts each trial in its own folder: a relative tldr:PATH reaches the trials made
    absolute, from the folder the sweep starts in; one that is not there is refused at start
    on the embedded Ray (on a cluster the path is the nodes' business)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "posts.jsonl").write_text(json.dumps({"post": "a post", "summary": "a tl;dr"}) + "\n")
    plan = parse_plan(smoke_spec(llm={"data": "tldr:data/posts.jsonl"}), "rel.yaml")
    assert plan.base_config["data"] == f"tldr:{tmp_path / 'data' / 'posts.jsonl'}"
    assert plan.spec.llm.data == "tldr:data/posts.jsonl"  # MLflow tags what the spec says
    plan.fitted(Cluster(gpus=0.0, embedded=True, cpus=2.0))
    for data in ("tldr:data/missing.jsonl", f"tldr:{tmp_path / 'missing.parquet'}"):
        missing = parse_plan(smoke_spec(llm={"data": data}), "rel.yaml")
        with pytest.raises(SpecError, match=r"rel\.yaml: llm\.data: .*missing\.(jsonl|parquet) does not exist"):
            missing.fitted(Cluster(gpus=0.0, embedded=True, cpus=2.0))
        missing.fitted(Cluster(gpus=0.0, embedded=False, cpus=2.0))  # a cluster's nodes may have it
    hub = parse_plan(smoke_spec(llm={"data": "tldr:CarperAI/openai_summarize_tldr"}), "hub.yaml")
    assert hub.base_config["data"] == "tldr:CarperAI/openai_summarize_tldr"  # a datasets id stays one


def test_a_cpu_sweeps_model_and_lora_targets_are_checked_before_launch(monkeypatch):
    """Without GPU memory to estimate, the model is still looked up and each trial's LoRA targets
    are found in it: an unknown model, or a target it lacks (which peft, given others, would skip
    without a word), is a SpecError of the dry run, not a failure of every trial at launch."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cpu = {"gpu_memory_gb": None}
    unknown = parse_plan(smoke_spec(llm={**cpu, "model": "no-such-owner/no-such-model"}), "cpu.yaml")
    with pytest.raises(SpecError, match=r"^cpu\.yaml: llm\.model: model 'no-such-owner/no-such-model' is unknown"):
        unknown.fitted(Cluster.unknown())
    lora = smoke_spec(llm=cpu, settings={"lora_r": 4, "lora_target_modules": ["q_proj", "v_projj"]})
    with pytest.raises(SpecError) as err:
        parse_plan(lora, "cpu.yaml").fitted(Cluster.unknown())
    assert str(err.value) == (
        "cpu.yaml: settings.lora_target_modules ['q_proj', 'v_projj']: in the llama model, 'v_projj' names no "
        "module (its linear layers are named down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj)")
    lora["settings"].pop("lora_target_modules")
    lora["search_space"]["lora_target_modules"] = {"grid": [["q_proj", "v_proj"], ["self_attn"]]}
    with pytest.raises(SpecError, match=r"^cpu\.yaml: search_space\.lora_target_modules \['self_attn'\]: in the "
                                        r"llama model, 'self_attn' names LlamaAttention, which LoRA cannot adapt \("):
        parse_plan(lora, "cpu.yaml").fitted(Cluster.unknown())
    lora["search_space"]["lora_target_modules"] = {"grid": [["q_proj", "v_proj"], ["embed_tokens"]]}
    parse_plan(lora, "cpu.yaml").fitted(Cluster.unknown())


@pytest.mark.parametrize("spec, asks", [
    (smoke_spec(llm={"num_workers": 2, "cpus_per_worker": 1.5}), "3.25 CPUs (resources.cpus, and llm.num_workers x llm.cpus_per_worker)"),
    ({"algorithm": "HAEPO", "env": "haepo/ChainMDP-v0", "resources": {"cpus": 3}, "stop": {"iterations": 1}},
     "3 CPUs (resources.cpus, the env runners' and the learners')"),
], ids=["language-model", "rl"])
def test_trials_that_ask_a_local_ray_for_more_cpus_than_it_has_fail_at_start(ray_session, tmp_path, spec, asks):
    """The session's Ray has 2 CPUs: Tune would keep such trials pending for ever, saying nothing with --quiet."""
    plan = parse_plan(spec, "cpus.yaml")
    with pytest.raises(SpecError) as err:
        run_sweep(plan, track=False, storage_path=str(tmp_path), out=io.StringIO(), verbose=0)
    assert f"cpus.yaml: each trial asks for {asks}, but the embedded local Ray has 2 (ray.num_cpus, else this " \
           "machine's): its trials would wait for ever." in str(err.value)
    assert not list(tmp_path.iterdir())  # nothing started


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_a_finished_trial_gives_the_heap_it_freed_back_to_the_os():
    """What a trial frees stays in glibc's heap, resident, until :func:`release_memory`."""
    mib = 2**20
    process = psutil.Process()
    pieces = [bytearray(64 * 1024) for _ in range(4096)]  # 256 MiB in pieces glibc serves from its heap
    pin = bytearray(64 * 1024)  # allocated after them: the heap's top cannot shrink past it
    held = process.memory_info().rss
    del pieces
    freed = process.memory_info().rss
    release_memory()
    released = process.memory_info().rss
    assert held - freed < 32 * mib, "freeing alone returned the memory: this test shows nothing here"
    assert freed - released > 224 * mib, f"release_memory gave back {(freed - released) / mib:.0f} MiB of 256"
    del pin
