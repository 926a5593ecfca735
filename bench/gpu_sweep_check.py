"""The GPU sweep check: real ``haepo sweep``s (Ray, Tune, MLflow on SQLite) whose trials share one
GPU, each claim a row that passes or fails (a failed row does not stop the next).

    python bench/gpu_sweep_check.py OUT [--device cuda|cpu] [--data tldr:PATH] [--rows NAME ...]

Rows (:data:`ROWS`):

- ``rl_learners``: a HAEPO sweep on CartPole-v1 of 8 trials at once, 4 of them with their
  learner on the GPU (``num_gpus_per_learner`` 0.25: four share the GPU), 4 with it on the CPU.
  Each trial tags the devices its learner's and env runner's parameters were on
  (``haepo.device.*``); the row fails on any GPU trial whose learner was not on CUDA.
- ``rl_iteration_time``: the same sweep's time per training iteration (median of each trial's
  iterations after the first), GPU learners against CPU learners, run side by side.
- ``loss_cuda_vs_cpu``: :func:`haepo_ray.loss.haepo_loss` and its gradients on one fixed batch
  (16 episodes of 20-500 steps of a CartPole-sized MLP policy), float32 on CUDA against float32
  on the CPU, relative to the CPU's float64 (:data:`LOSS_RTOL`).
- ``ray_gpu_assignment``: every trial of every sweep here ran on a device Ray gave it: a GPU
  trial's device is ``cuda:i`` with ``i`` below the count of ``CUDA_VISIBLE_DEVICES``, which
  equals Ray's GPU ids for the trial; a trial that asked for no GPU has no Ray GPU id and ran
  on the CPU.
- ``lm_refused``: a sweep whose trial the simulator says cannot fit its GPU is refused before
  launch, naming the numbers, with no trial run in MLflow.
- ``lm_packed``: a language-model sweep, HAEPO, GRPO and DPO x 2 seeds, on a randomly
  initialised model of a real architecture (``random:qwen2.5-0.5b``; no weights can reach the
  GPU machine) with ``gpus_per_worker: auto`` (each trial asks Ray for the fraction of the GPU
  its simulated reserved memory and reserve need), against the same sweep at one trial per
  GPU. Each trial's measured peaks (``torch.cuda`` allocated and reserved, every phase and
  update) beside its simulated ones; none may fail; how many ran at once and both wall times.
  On ``--device cpu``: the packing is planned only (each trial's share, how many fit), and the
  same trials run on the CPU with no GPU asked (``ray_gpu_assignment`` checks them).

``--device cpu`` (the slow test tier; Ray is told it has one GPU, torch has none): every row
but ``loss_cuda_vs_cpu``, with each trial on the device torch can give it, the CPU. A GPU row
expects ``cuda`` only where torch sees a GPU. ``--data``: the language-model trials' data
(default ``aclsum``, from its package; the GPU machine has none: ``tldr:PATH`` of a JSONL with
``post`` and ``summary``).

Writes ``OUT/gpu_sweep_check.json`` and ``OUT/gpu_sweep_check.md`` after each row; the sweeps'
logs, MLflow store and Ray results under ``OUT/work`` (``--work`` elsewhere). Exit status 0 when
every row run passed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository, without installing it

import torch  # noqa: E402
import yaml  # noqa: E402

from haepo_ray import names  # noqa: E402

GIB = 2**30
LOSS_RTOL = 1e-3  # float32 against float64, relative to the largest magnitude (CPU float32: 7e-5 on grads)
SWEEP_TIMEOUT_S = 360
LM_MODEL = {"cuda": "random:qwen2.5-0.5b", "cpu": "tiny"}
# The LM trials' settings: short enough that 12 trials (two sweeps) fit the check's 8 minutes.
LM_SETTINGS = {"sft_examples": 4, "sft_batch": 2, "rl_updates": 2, "batch_size": 2, "group_size": 4,
               "max_new_tokens": 24, "min_new_tokens": 24, "max_source_words": 48, "micro_batch_size": 0,
               "eval_prompts": 2, "eval_batch": 2, "lr": 1.0e-5}
LM_PROMPT_TOKENS = 128  # bounds the prompts above (48 source words + the instruction, word-level tokens)


# --------------------------------------------------------------------------- sweeps and their runs

class Check:
    """One run of the check: the device, the work folder, the MLflow store and the sweeps' runs."""

    def __init__(self, device: str, work: Path, data: str) -> None:
        self.device, self.work, self.data = device, work, data
        self.cuda = device == "cuda"
        work.mkdir(parents=True, exist_ok=True)
        self.uri = f"sqlite:///{work / 'mlflow.db'}"
        self.sweeps: dict[str, dict[str, Any]] = {}  # experiment -> {"rc", "wall_s", "log"}

    def sweep(self, name: str, spec: dict[str, Any], *args: str) -> dict[str, Any]:
        """``haepo sweep`` of ``spec`` as experiment ``name`` in its own process; its exit status,
        wall time and log (``work/<name>.log``)."""
        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"name": name, **spec}, sort_keys=False))
        log = self.work / f"{name}.log"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               "RAY_USAGE_STATS_ENABLED": "0"}
        start = time.perf_counter()
        with open(log, "w") as f:
            try:
                rc = subprocess.run([sys.executable, "-m", "haepo_ray.cli", "sweep", str(path), "--quiet",
                                     "--tracking-uri", self.uri, "--storage-path", str(self.work / "ray_results"),
                                     *args], stdout=f, stderr=subprocess.STDOUT, cwd=self.work, env=env,
                                    timeout=SWEEP_TIMEOUT_S).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        self.sweeps[name] = {"rc": rc, "wall_s": round(time.perf_counter() - start, 1), "log": log.read_text()}
        return self.sweeps[name]

    def runs(self, experiment: str) -> list[Any]:
        """The trial runs (MLflow ``Run``) of ``experiment``."""
        import mlflow

        client = mlflow.MlflowClient(self.uri)
        found = client.get_experiment_by_name(experiment)
        if found is None:
            return []
        return client.search_runs([found.experiment_id], filter_string=f"tags.`{names.ROLE}` = 'trial'",
                                  max_results=1000)

    def history(self, run: Any, key: str) -> list[float]:
        import mlflow

        return [m.value for m in sorted(mlflow.MlflowClient(self.uri).get_metric_history(run.info.run_id, key),
                                        key=lambda m: m.step)]


def _failed_sweep(result: dict[str, Any]) -> str | None:
    if result["rc"] == 0:
        return None
    return f"haepo sweep exited {result['rc']}: " + " | ".join(result["log"].strip().splitlines()[-3:])


def _at_once(runs: list[Any]) -> int:
    """The most runs open at one moment (MLflow start and end times)."""
    events = sorted([(r.info.start_time, 1) for r in runs] + [(r.info.end_time or 2**62, -1) for r in runs],
                    key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


# --------------------------------------------------------------------------- RL rows

RL_SPEC = {
    "algorithm": "HAEPO", "env": "CartPole-v1",
    "settings": {"num_env_runners": 0, "batch_size": 8, "model_config": {"fcnet_hiddens": [64, 64]}},
    "search_space": {"num_gpus_per_learner": {"grid": [0.25, 0]}, "seed": {"grid": [0, 1, 2, 3]}},
    "search": {"algorithm": "grid"}, "scheduler": {"type": "fifo"},
    "metric": "env_runners/episode_return_mean", "mode": "max",
    "stop": {"iterations": 8}, "resources": {"cpus": 1, "gpus": 0},
    "max_concurrent_trials": 8, "max_failures": 0, "checkpoint_frequency": 0, "checkpoint_at_end": False,
}


def _gpu_learner(run: Any) -> bool:
    return float(run.data.params.get("num_gpus_per_learner", 0)) > 0


def row_rl_learners(check: Check) -> dict[str, Any]:
    spec = {**RL_SPEC, "ray": {"num_cpus": 8, "num_gpus": 1}}
    if not check.cuda:  # RLlib's GPU learner needs CUDA: 4 CPU-learner trials of 3 iterations on 2 cores
        spec |= {"search_space": {"num_gpus_per_learner": {"grid": [0]}, "seed": {"grid": [0, 1, 2, 3]}},
                 "stop": {"iterations": 3}, "max_concurrent_trials": 2, "ray": {"num_cpus": 2, "num_gpus": 1}}
    result = check.sweep("rl_learners", spec)
    runs = check.runs("rl_learners")
    expected = "cuda" if check.cuda else "cpu"
    gpu_runs = [r for r in runs if _gpu_learner(r)]
    space = spec["search_space"]
    expected_runs = len(space["seed"]["grid"]) * len(space["num_gpus_per_learner"]["grid"])
    trials = [{"trial": r.data.tags.get(names.TRIAL_NAME),
               "gpus_per_learner": r.data.params.get("num_gpus_per_learner"), "status": r.info.status,
               "learner": r.data.tags.get(names.DEVICE_LEARNER),
               "env_runner": r.data.tags.get(names.DEVICE_ENV_RUNNER),
               "ray_gpu_ids": r.data.tags.get(names.DEVICE_RAY_GPU_IDS)} for r in runs]
    wrong = [t for t, r in zip(trials, runs, strict=True) if _gpu_learner(r)
             and not str(t["learner"]).startswith(expected)]
    failures = [msg for msg in (
        _failed_sweep(result),
        f"{len(runs)} trial runs, expected {expected_runs}" if len(runs) != expected_runs else None,
        f"not FINISHED: {[t['trial'] for t in trials if t['status'] != 'FINISHED']}"
        if any(t["status"] != "FINISHED" for t in trials) else None,
        f"GPU-learner trials whose learner was not on {expected}: {wrong}" if wrong else None,
    ) if msg]
    learners = sorted({str(t["learner"]) for t, r in zip(trials, runs, strict=True) if _gpu_learner(r) == check.cuda})
    what = "GPU-learner trials (0.25 GPU each)" if check.cuda else "trials (no CUDA: CPU learners only)"
    return {"passed": not failures, "failures": failures,
            "measured": f"{len(gpu_runs) if check.cuda else len(runs)} {what} learned on {', '.join(learners) or '-'}; "
                        f"{_at_once(runs)} trials ran at once; sweep {result['wall_s']} s",
            "trials": trials, "at_once": _at_once(runs), "wall_s": result["wall_s"]}


def row_rl_iteration_time(check: Check) -> dict[str, Any]:
    runs = check.runs("rl_learners")
    times: dict[str, list[float]] = {"gpu": [], "cpu": []}
    for run in runs:
        per_iter = check.history(run, names.TIME_THIS_ITER_S)[1:]  # the first builds and warms up
        if per_iter:
            times["gpu" if _gpu_learner(run) else "cpu"].append(statistics.median(per_iter))
    if not times["cpu"] or check.cuda and not times["gpu"]:
        return {"passed": False, "failures": [f"no iteration times: {len(times['gpu'])} GPU-learner and "
                                              f"{len(times['cpu'])} CPU-learner trials reported"]}
    cpu = statistics.median(times["cpu"])
    if not check.cuda:
        return {"passed": True, "failures": [], "cpu_learner_s": cpu, "per_trial_s": times,
                "measured": f"median s/iteration, CPU learner: {cpu:.3f} (no CUDA: no GPU learner to compare)"}
    gpu = statistics.median(times["gpu"])
    return {"passed": True, "failures": [], "gpu_learner_s": gpu, "cpu_learner_s": cpu, "ratio": gpu / cpu,
            "per_trial_s": times,
            "measured": f"median s/iteration: learner on the GPU {gpu:.3f}, on the CPU {cpu:.3f} "
                        f"(ratio {gpu / cpu:.2f}; 8 episodes per iteration, MLP 64x64, 8 trials at once)"}


def _loss_and_grads(device: str, dtype: torch.dtype) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """HAEPO's loss on one fixed batch: 16 episodes of 20-500 steps of a 4-64-64-2 MLP policy."""
    from haepo_ray.loss import haepo_loss, trajectory_log_likelihood

    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(20, 501, (16,), generator=gen)
    obs = torch.randn(int(lengths.sum()), 4, generator=gen)
    actions = torch.randint(0, 2, (len(obs),), generator=gen)
    episode = torch.repeat_interleave(torch.arange(16), lengths)
    torch.manual_seed(0)
    policy = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                 torch.nn.Linear(64, 2))
    reference = torch.nn.Sequential(*(type(m)(*m.weight.shape[::-1]) if isinstance(m, torch.nn.Linear) else m
                                      for m in policy))
    policy, reference = policy.to(device, dtype), reference.to(device, dtype)
    obs, actions, episode = obs.to(device, dtype), actions.to(device), episode.to(device)

    def traj_logp(net: torch.nn.Module) -> torch.Tensor:
        step_logp = torch.log_softmax(net(obs), -1).gather(1, actions[:, None]).squeeze(1)
        return trajectory_log_likelihood(step_logp, episode, 16)

    with torch.no_grad():
        ref = traj_logp(reference)
    out = haepo_loss(traj_logp(policy), ref, lengths.to(device, dtype), beta_ent=0.05, beta_kl=0.05)
    grads = torch.autograd.grad(out.loss, list(policy.parameters()))
    return out.loss.detach().cpu().double(), [g.cpu().double() for g in grads]


def row_loss_cuda_vs_cpu(check: Check) -> dict[str, Any]:
    if not check.cuda:
        return {"passed": None, "failures": [], "measured": "skipped: no CUDA (--device cpu)"}
    exact = _loss_and_grads("cpu", torch.float64)

    def error(got: tuple[torch.Tensor, list[torch.Tensor]]) -> dict[str, float]:
        loss = float((got[0] - exact[0]).abs() / exact[0].abs().clamp_min(1e-30))
        grads = max(float((g - e).abs().max() / e.abs().max().clamp_min(1e-30)) for g, e in zip(got[1], exact[1],
                                                                                               strict=True))
        return {"loss": loss, "grads": grads}

    errors = {"cpu_float32": error(_loss_and_grads("cpu", torch.float32)),
              "cuda_float32": error(_loss_and_grads("cuda", torch.float32)),
              "cuda_float64": error(_loss_and_grads("cuda", torch.float64))}
    cuda, cpu = _loss_and_grads("cuda", torch.float32), _loss_and_grads("cpu", torch.float32)
    between = {"loss": float((cuda[0] - cpu[0]).abs() / cpu[0].abs()),
               "grads": max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(cuda[1], cpu[1], strict=True))}
    failures = [f"{name} {part} relative error {value:.2e} > {LOSS_RTOL:g}"
                for name, errs in errors.items() for part, value in errs.items() if value > LOSS_RTOL]
    return {"passed": not failures, "failures": failures, "errors_vs_cpu_float64": errors,
            "cuda_vs_cpu_float32": between,
            "measured": f"relative to CPU float64: CUDA float32 loss {errors['cuda_float32']['loss']:.1e}, grads "
                        f"{errors['cuda_float32']['grads']:.1e} (CPU float32 {errors['cpu_float32']['loss']:.1e}, "
                        f"{errors['cpu_float32']['grads']:.1e}); CUDA float64 {errors['cuda_float64']['grads']:.1e}; "
                        f"CUDA vs CPU float32: loss {between['loss']:.1e}, grads {between['grads']:.1e}; "
                        f"tolerance {LOSS_RTOL:g}"}


# --------------------------------------------------------------------------- LM rows

def _lm_spec(check: Check, gpus_per_worker: float | str | None) -> dict[str, Any]:
    """The LM sweep: HAEPO, GRPO and DPO x 2 seeds, one trial per process, each estimated
    against the GPU's memory (torch's; 8 GiB without CUDA); ``gpus_per_worker`` None: CPU trials."""
    memory = torch.cuda.get_device_properties(0).total_memory / GIB if check.cuda else 8.0
    llm: dict[str, Any] = {"model": LM_MODEL[check.device], "data": check.data, "num_workers": 0,
                           "cpus_per_worker": 1, "prompt_tokens": LM_PROMPT_TOKENS, "gpu_memory_gb": round(memory, 2)}
    if gpus_per_worker is not None:
        llm |= {"use_gpu": True, "gpus_per_worker": gpus_per_worker}
    return {"llm": llm, "search_space": {"algorithm": {"grid": ["HAEPO", "GRPO", "DPO"]}, "seed": {"grid": [0, 1]}},
            "settings": {**LM_SETTINGS, "dtype": "bfloat16" if check.cuda else "float32"},
            "metric": names.LLM_REWARD, "mode": "max", "resources": {"cpus": 0.5},
            "max_concurrent_trials": 6, "max_failures": 0, "checkpoint_frequency": 0,
            # a 0.5B policy's final checkpoint is 1 GB a trial: MLflow's copy of it is no claim here
            # (the first H200 run wrote 5.6 GB of artifacts for 6 trials)
            "tracking": {"log_checkpoints": False},
            "ray": {"num_cpus": 12 if check.cuda else 2, "num_gpus": 1}}


def _lm_trials(check: Check, experiment: str) -> list[dict[str, Any]]:
    rows = []
    for run in check.runs(experiment):
        params, tags = run.data.params, run.data.tags
        peaks = {kind: max((max(check.history(run, key), default=0.0) for key in run.data.metrics
                            if key.startswith(f"{prefix}/")), default=0.0) / 1024
                 for kind, prefix in (("allocated", "peak_memory_mb"), ("reserved", "peak_memory_reserved_mb"))}
        rows.append({"trial": tags.get(names.TRIAL_NAME), "algorithm": tags.get(names.ALGORITHM),
                     "status": run.info.status, "policy": tags.get(names.DEVICE_POLICY),
                     "ray_gpu_ids": tags.get(names.DEVICE_RAY_GPU_IDS),
                     "measured_allocated_gib": peaks["allocated"], "measured_reserved_gib": peaks["reserved"],
                     "simulated_peak_gib": float(params.get("gpu_memory/estimated_peak_gib", "nan")),
                     "simulated_reserved_gib": float(params.get("gpu_memory/estimated_reserved_gib", "nan"))})
    return rows


def _planned_shares(check: Check, spec: dict[str, Any]) -> list[float]:
    """Each trial's GPU share as the sweep plans it, from the spec, against one GPU."""
    from haepo_ray.sweep.cluster import Cluster
    from haepo_ray.sweep.kinds import parse_spec, resolve_plan
    from haepo_ray.sweep.planned import planned_trials

    plan = resolve_plan(parse_spec({"name": "planned", **spec}))
    memory = spec["llm"]["gpu_memory_gb"]
    fitted = plan.fitted(Cluster(gpus=1.0, gpu_memory_gib=memory))
    return [fitted.trial_resources(t.values)["GPU"] for t in planned_trials(fitted)]


def row_lm_packed(check: Check) -> dict[str, Any]:
    spec = _lm_spec(check, "auto")
    shares = _planned_shares(check, spec)
    fit = int(1 // max(shares))
    planned = f"planned shares {sorted(set(round(s, 3) for s in shares))} of a GPU: {min(fit, len(shares))} of " \
              f"{len(shares)} trials fit at once"
    if not check.cuda:  # CUDA trials need CUDA: the same trials run on the CPU, no GPU asked
        result = check.sweep("lm_cpu", _lm_spec(check, None))
        trials = _lm_trials(check, "lm_cpu")
        unestimated = [t["trial"] for t in trials if not t["simulated_reserved_gib"] > 0]
        failures = [msg for msg in (
            _failed_sweep(result), f"{len(trials)} trial runs, expected 6" if len(trials) != 6 else None,
            f"trials without their simulated memory: {unestimated}" if unestimated else None,
            f"not FINISHED: {[t['trial'] for t in trials if t['status'] != 'FINISHED']}"
            if any(t["status"] != "FINISHED" for t in trials) else None,
            "more than one trial fits 1 GPU at once" if fit < 2 else None) if msg]
        return {"passed": not failures, "failures": failures, "shares": shares, "trials": trials,
                "measured": f"{planned} (planned only: no CUDA); 6 CPU trials {result['wall_s']} s"}
    packed = check.sweep("lm_packed", spec)
    trials = _lm_trials(check, "lm_packed")
    at_once = _at_once(check.runs("lm_packed"))
    single = check.sweep("lm_one_per_gpu", _lm_spec(check, 1.0))
    single_trials = _lm_trials(check, "lm_one_per_gpu")
    over = [t["trial"] for t in trials if not t["measured_reserved_gib"] <= t["simulated_reserved_gib"]]
    failures = [msg for msg in (
        _failed_sweep(packed), _failed_sweep(single),
        f"{len(trials)} and {len(single_trials)} trial runs, expected 6 and 6"
        if (len(trials), len(single_trials)) != (6, 6) else None,
        f"not FINISHED: {[t['trial'] for t in trials + single_trials if t['status'] != 'FINISHED']}"
        if any(t["status"] != "FINISHED" for t in trials + single_trials) else None,
        f"trials over their simulated reserved memory: {over}" if over else None,
        f"{at_once} trials ran at once, planned {min(fit, 6)}" if at_once < 2 else None,
    ) if msg]
    ratios = [t["measured_reserved_gib"] / t["simulated_reserved_gib"] for t in trials]
    return {"passed": not failures, "failures": failures, "shares": shares, "trials": trials,
            "single_trials": single_trials, "at_once": at_once, "packed_wall_s": packed["wall_s"],
            "one_per_gpu_wall_s": single["wall_s"],
            "measured": f"{planned}; {at_once} ran at once; measured/simulated reserved "
                        f"{min(ratios, default=0):.2f}-{max(ratios, default=0):.2f}; wall {packed['wall_s']} s packed "
                        f"against {single['wall_s']} s at one trial per GPU "
                        f"({single['wall_s'] / max(packed['wall_s'], 1e-9):.2f}x)"}


def row_lm_refused(check: Check) -> dict[str, Any]:
    spec = _lm_spec(check, "auto")
    spec["llm"] |= {"model": "random:qwen2.5-1.5b", "gpu_memory_gb": 4, "fit": "refuse"}
    spec["settings"] = {**spec["settings"], "dtype": "bfloat16"}
    result = check.sweep("lm_refused", spec)
    runs = check.runs("lm_refused")
    refusal = [line for line in result["log"].splitlines() if "GiB" in line]
    failures = [msg for msg in (
        "the sweep did not fail" if result["rc"] == 0 else None,
        "no refusal naming GiB in its output" if not refusal else None,
        f"{len(runs)} trial runs in MLflow" if runs else None) if msg]
    return {"passed": not failures, "failures": failures, "rc": result["rc"], "refusal": refusal[:6],
            "measured": f"exit {result['rc']}, {len(runs)} trial runs; " + (refusal[0][:300] if refusal else "")}


def row_ray_gpu_assignment(check: Check) -> dict[str, Any]:
    trials = [("rl_learners", run, run.data.tags.get(names.DEVICE_LEARNER), _gpu_learner(run))
              for run in check.runs("rl_learners")]
    for experiment in ("lm_packed", "lm_one_per_gpu", "lm_cpu"):
        trials += [(experiment, run, run.data.tags.get(names.DEVICE_POLICY), experiment != "lm_cpu")
                   for run in check.runs(experiment)]
    if not trials:
        return {"passed": False, "failures": ["no trial runs: the sweeps above did not run"]}
    failures = []
    for experiment, run, device, asked_gpu in trials:
        tags = run.data.tags
        ray_ids = [i for i in tags.get(names.DEVICE_RAY_GPU_IDS, "").split(",") if i]
        visible = tags.get(names.DEVICE_CUDA_VISIBLE, "unset")
        where = f"{experiment} {tags.get(names.TRIAL_NAME)}: device {device}, Ray GPU ids {ray_ids}, " \
                f"CUDA_VISIBLE_DEVICES {visible!r}"
        if device is None:
            failures.append(f"{where}: no device tag")
        elif not asked_gpu:
            if ray_ids or device != "cpu":
                failures.append(f"{where}: asked for no GPU")
        elif not ray_ids or visible.split(",") != ray_ids:
            failures.append(f"{where}: Ray gave no GPU, or CUDA_VISIBLE_DEVICES is not Ray's")
        elif check.cuda and not all(d.startswith("cuda:") and int(d.split(":")[1]) < len(ray_ids)
                                    for d in device.split(",")):
            failures.append(f"{where}: not on a GPU Ray gave it")
        elif not check.cuda and device != "cpu":
            failures.append(f"{where}: no CUDA here, yet not on the CPU")
    asked = sum(t[3] for t in trials)
    return {"passed": not failures, "failures": failures,
            "measured": f"{len(trials)} trials: {asked} asked for a GPU share, {len(trials) - asked} for none; "
                        f"{len(failures)} on a device Ray did not give them"}


ROWS: dict[str, tuple[str, Callable[[Check], dict[str, Any]]]] = {
    "rl_learners": ("RL: 4 trials share one GPU, every learner on CUDA", row_rl_learners),
    "rl_iteration_time": ("RL: time per iteration, GPU learner against CPU learner", row_rl_iteration_time),
    "loss_cuda_vs_cpu": ("HAEPO's loss and gradients on CUDA equal the CPU's", row_loss_cuda_vs_cpu),
    "lm_refused": ("LM: a trial that cannot fit is refused before launch", row_lm_refused),
    "lm_packed": ("LM: trials packed onto one GPU by their simulated memory", row_lm_packed),
    "ray_gpu_assignment": ("Every trial on a device Ray gave it; no GPU asked, the CPU", row_ray_gpu_assignment),
}


# --------------------------------------------------------------------------- report

def _table(result: dict[str, Any]) -> str:
    lines = [f"GPU sweep check on {result['device_name']} ({result['device']}), {result['date']}, commit "
             f"{result['commit']}; torch {result['torch']}, Ray {result['ray']}; {result['wall_s']:.0f} s", "",
             "| row | claim | result | measured |", "|---|---|---|---|"]
    for name, row in result["rows"].items():
        verdict = {True: "pass", False: "FAIL", None: "skipped"}[row["passed"]]
        detail = row.get("measured", "") + ("; " + "; ".join(row["failures"]) if row["failures"] else "")
        lines.append(f"| {name} | {ROWS[name][0]} | {verdict} | {detail.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--data", default="aclsum", help="the LM trials' data: aclsum | tldr:PATH")
    parser.add_argument("--rows", nargs="+", choices=tuple(ROWS), default=list(ROWS))
    parser.add_argument("--work", type=Path, help="the sweeps' folder (default OUT/work)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device (--device cpu runs every other row)")
    import ray

    check = Check(args.device, (args.work or args.out / "work").resolve(), args.data)
    started = time.perf_counter()
    result: dict[str, Any] = {
        "device": args.device, "date": time.strftime("%Y-%m-%d"), "commit": _commit(),
        "device_name": torch.cuda.get_device_name() if check.cuda else platform.processor() or "cpu",
        "torch": torch.__version__, "ray": ray.__version__, "rows": {}}
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.rows:
        print(f"--- {name}: {ROWS[name][0]}", flush=True)
        try:
            row = ROWS[name][1](check)
        except Exception as err:  # a row that breaks leaves the others
            row = {"passed": False, "failures": [f"{type(err).__name__}: {err}"], "traceback": traceback.format_exc()}
        result["rows"][name] = row
        result["wall_s"] = time.perf_counter() - started
        print(json.dumps({k: row.get(k) for k in ("passed", "measured", "failures")}), flush=True)
        (args.out / "gpu_sweep_check.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
        (args.out / "gpu_sweep_check.md").write_text(_table(result))
    print(_table(result))
    return 0 if all(r["passed"] is not False for r in result["rows"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
