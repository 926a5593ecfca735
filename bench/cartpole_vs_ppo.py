"""CartPole-v1: HAEPO against RLlib's PPO, tuned and with its defaults, side by side.

For every seed, each set-up of ``--algos`` in turn (interleaved by seed, so drift in the
machine's load hits all), each until the mean return of the last 100 episodes reaches
``--target`` or the wall-clock budget of the run ends. Per run: time to solve (training time only; the
algorithm's build time is measured and reported apart), env steps to solve, env steps/s,
learner updates (gradient steps)/s, and where the time goes (sampling vs learner update).

    python bench/cartpole_vs_ppo.py                                  # full: seeds 0-4, 200 s
    python bench/cartpole_vs_ppo.py --seeds 0 --budget-s 30          # quick check

Set-ups (``--algos``):

- ``HAEPO`` (paper, CartPole section): MLP obs -> 128 -> 2 with ReLU, lr 1e-2, gamma 0.99,
  M = 8 episodes per update, beta_ent = beta_kl = 0.1, grad-norm clip 0.5.
- ``HAEPO-searched``: the same network, with the best settings that
  ``haepo sweep tune_configs/cartpole_search.yaml`` found (:data:`HAEPO_SEARCHED`).
- ``PPO-tuned``: RL Zoo3's tuned CartPole-v1 hyper-parameters (:data:`PPO_ZOO`; 8 envs of
  32 steps per batch, its own number of envs whatever ``--num-envs-per-env-runner`` says),
  with Stable-Baselines3's PPO defaults where RLlib's differ, since the Zoo's values are
  tuned on top of those.
- ``PPO-paper``: the paper's PPO, as ``tune_configs/paper/cartpole_ppo.yaml`` (:data:`PPO_PAPER`):
  clip 0.2, one epoch per update, no entropy bonus, 512 env steps per update in minibatches of
  128, lr 1e-3, gamma 0.99, the HAEPO set-ups' MLP (128 ReLU); RLlib's defaults otherwise.
- ``PPO-default``: ``PPOConfig()`` defaults (lr 5e-5, 4000 steps per batch, 30 epochs of
  minibatches of 128, [256, 256] tanh MLP, ...).

The env-runner setting (``--num-env-runners``, ``--num-envs-per-env-runner``) is the same
for all but ``PPO-tuned`` (``--num-envs-per-env-runner 8`` gives every set-up 8 envs, as
``PPO-tuned``), unless ``--haepo-envs-per-env-runner`` gives the HAEPO set-ups their own
number of envs per runner. Each HAEPO
set-up is compared with each PPO set-up (ratios of the medians).

Measurements, per iteration: ``time.perf_counter`` since the start of training,
``env_runners/num_env_steps_sampled_lifetime``, ``env_runners/episode_return_mean``
(RLlib 2.60's mean over the last iteration's episodes) and from it the mean of the last
``--window`` (100) episodes, the solved criterion; the learner's gradient steps (counted by
wrapping the local learner's ``apply_gradients``, so the same for every set-up), the
time spent in sampling and in ``learner_group.update`` (wrapped, exact), RLlib's own
``timers`` (smoothed), and the 1-minute load average.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import gzip
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ENV = "CartPole-v1"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--budget-s", type=float, default=200.0, help="wall-clock training budget per run")
    p.add_argument("--target", type=float, default=475.0, help="mean return of the last --window episodes")
    p.add_argument("--window", type=int, default=100, help="episodes in the solved criterion's mean")
    p.add_argument("--algos", nargs="+", default=["HAEPO", "PPO-default"], choices=list(CONFIGS))
    p.add_argument("--out", default="bench/results/cartpole_vs_ppo.json.gz", help="JSON, gzipped where the name ends in .gz")
    p.add_argument("--num-cpus", type=int, default=2)
    p.add_argument("--num-env-runners", type=int, default=0, help="same for every set-up")
    p.add_argument("--num-envs-per-env-runner", type=int, default=1,
                   help="same for every set-up but PPO-tuned (RL Zoo's 8)")
    p.add_argument("--haepo-envs-per-env-runner", type=int, default=None,
                   help="the HAEPO set-ups only (their lean sampler batches the forward pass over "
                        "their envs); default: --num-envs-per-env-runner")
    p.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads in this process (local env runner and learner of every "
        "set-up); on a shared 2-core machine 2 threads made PPO's minibatch updates up to "
        "20x slower (spinning OpenMP threads under load); 0 keeps torch's default",
    )
    p.add_argument(
        "--haepo-activation", default="relu", help="the paper's MLP uses ReLU (RLlib's default is tanh)"
    )
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- configs


HAEPO_PAPER = {
    "episodes_per_batch": 8, "lr": 1e-2, "beta_ent": 0.1, "beta_kl": 0.1, "grad_clip": 0.5, "gamma": 0.99,
}

# The best trial of `haepo sweep tune_configs/cartpole_search.yaml`, 2026-11-23 (BENCHMARKS.md).
HAEPO_SEARCHED = {
    **HAEPO_PAPER,
    "lr": 0.01467,
    "beta_ent": 0.07772,
    "beta_kl": 0.05104,
    "reward_normalization": "zscore",
    "num_epochs": 1,
    "reference_policy": "initial",
}

# The paper's PPO (CartPole section), as tune_configs/paper/cartpole_ppo.yaml: the paper gives
# clip 0.2, one epoch, no entropy bonus and gamma 0.99; lr and the batch are that spec's choice.
PPO_PAPER = {
    "train_batch_size_per_learner": 512,
    "minibatch_size": 128,
    "num_epochs": 1,
    "clip_param": 0.2,
    "entropy_coeff": 0.0,
    "lr": 1e-3,
    "gamma": 0.99,
}

# RL Zoo3, hyperparams/ppo.yml, CartPole-v1: n_envs 8, n_steps 32, batch_size 256, n_epochs
# 20, gae_lambda 0.8, gamma 0.98, learning_rate and clip_range 1e-3 and 0.2 (the Zoo decays
# both linearly over its 1e5 steps; constant here), ent_coef 0, SB3's MlpPolicy (separate
# 64x64 tanh policy and value nets). SB3 defaults where RLlib's differ: no KL penalty, value
# loss weight 0.5, grad-norm clip 0.5, no value-loss clip (RLlib clips it at 10).
ZOO_ENVS = 8
PPO_ZOO = {
    "train_batch_size_per_learner": ZOO_ENVS * 32,
    "minibatch_size": 256,
    "num_epochs": 20,
    "lambda_": 0.8,
    "gamma": 0.98,
    "lr": 1e-3,
    "clip_param": 0.2,
    "entropy_coeff": 0.0,
    "use_kl_loss": False,
    "vf_loss_coeff": 0.5,
    "grad_clip": 0.5,
    "vf_clip_param": float("inf"),
}


def haepo_config(seed: int, args: argparse.Namespace, training: dict = HAEPO_PAPER):
    from haepo_ray.rl.algorithm import HAEPOConfig

    return (
        HAEPOConfig()
        .environment(ENV)
        .training(**training)
        .rl_module(model_config={"fcnet_hiddens": [128], "fcnet_activation": args.haepo_activation})
        .env_runners(
            num_env_runners=args.num_env_runners,
            num_envs_per_env_runner=args.haepo_envs_per_env_runner or args.num_envs_per_env_runner,
        )
        .debugging(seed=seed)
    )


def ppo_default_config(seed: int, args: argparse.Namespace):
    from ray.rllib.algorithms.ppo import PPOConfig

    return (
        PPOConfig()
        .environment(ENV)
        .env_runners(
            num_env_runners=args.num_env_runners,
            num_envs_per_env_runner=args.num_envs_per_env_runner,
        )
        .debugging(seed=seed)
    )


def ppo_paper_config(seed: int, args: argparse.Namespace):
    from ray.rllib.algorithms.ppo import PPOConfig

    return (
        PPOConfig()
        .environment(ENV)
        .training(**PPO_PAPER)
        .rl_module(model_config={"fcnet_hiddens": [128], "fcnet_activation": args.haepo_activation})
        .env_runners(
            num_env_runners=args.num_env_runners,
            num_envs_per_env_runner=args.num_envs_per_env_runner,
        )
        .debugging(seed=seed)
    )


def ppo_tuned_config(seed: int, args: argparse.Namespace):
    from ray.rllib.algorithms.ppo import PPOConfig

    return (
        PPOConfig()
        .environment(ENV)
        .training(**PPO_ZOO)
        .rl_module(model_config={"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh",
                                 "vf_share_layers": False})
        .env_runners(num_env_runners=args.num_env_runners, num_envs_per_env_runner=ZOO_ENVS)
        .debugging(seed=seed)
    )


CONFIGS: dict[str, Callable] = {
    "HAEPO": haepo_config,
    "HAEPO-searched": functools.partial(haepo_config, training=HAEPO_SEARCHED),
    "PPO-paper": ppo_paper_config,
    "PPO-tuned": ppo_tuned_config,
    "PPO-default": ppo_default_config,
}


# ----------------------------------------------------------------------------- instrumentation


class Clock:
    """Total seconds and calls of the functions it wraps."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def wrap(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def timed(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.seconds += time.perf_counter() - t
                self.calls += 1

        return timed


def instrument(algo) -> dict[str, Clock]:
    """Wraps sampling, the learner-group update and the learner's gradient steps."""
    clocks = {"sample": Clock(), "learner_update": Clock(), "grad_steps": Clock()}
    group = algo.learner_group
    group.update = clocks["learner_update"].wrap(group.update)
    from haepo_ray.rl.algorithm import HAEPO
    from haepo_ray.upstream import rllib as rllib_internals

    learner = rllib_internals.local_learner(group)
    if learner is None:
        raise RuntimeError("this benchmark counts gradient steps on a local learner (num_learners=0)")
    learner.apply_gradients = clocks["grad_steps"].wrap(learner.apply_gradients)
    if isinstance(algo, HAEPO):
        algo.sample_episodes = clocks["sample"].wrap(algo.sample_episodes)
    else:  # PPO calls the module-level synchronous_parallel_sample
        rllib_internals.time_ppo_sampling(clocks["sample"].wrap)
    return clocks


def dig(d: Any, *keys: str, default=None):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return d


def num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if v == v else None  # NaN -> None


# ----------------------------------------------------------------------------- one run


def last_episodes_mean(iters: list[dict], window: int) -> float | None:
    """Mean return of the last ``window`` episodes, None before there are that many.

    RLlib 2.60's ``env_runners/episode_return_mean`` is the mean over the episodes of the
    last iteration only (8 for HAEPO here); this recombines the iterations' means, weighted
    by their episode counts, the oldest iteration counted in part."""
    total, count, previous = 0.0, 0, [0] + [row["episodes"] for row in iters[:-1]]
    for row, before in zip(reversed(iters), reversed(previous)):
        n = row["episodes"] - before
        if n <= 0 or row["return_mean"] is None:
            continue
        take = min(n, window - count)
        total, count = total + take * row["return_mean"], count + take
        if count == window:
            return total / window
    return None



def run_one(algo_name: str, seed: int, args: argparse.Namespace) -> dict:
    config = CONFIGS[algo_name](seed, args)
    t_build = time.perf_counter()
    algo = config.build_algo()
    build_s = time.perf_counter() - t_build
    clocks = instrument(algo)
    iters: list[dict] = []
    solved_at: dict | None = None
    error = None
    t0 = time.perf_counter()
    try:
        while True:
            result = algo.train()
            t = time.perf_counter() - t0
            learner = dig(result, "learners", "default_policy", default={}) or {}
            row = {
                "iter": len(iters) + 1,
                "t": round(t, 3),
                "env_steps": int(dig(result, "env_runners", "num_env_steps_sampled_lifetime", default=0) or 0),
                "return_mean": num(dig(result, "env_runners", "episode_return_mean")),
                "episodes": int(dig(result, "env_runners", "num_episodes_lifetime", default=0) or 0),
                "grad_steps": clocks["grad_steps"].calls,
                "sample_s": round(clocks["sample"].seconds, 3),
                "learner_update_s": round(clocks["learner_update"].seconds, 3),
                "timer_sampling_s": num(dig(result, "timers", "env_runner_sampling_timer")),
                "timer_learner_update_s": num(dig(result, "timers", "learner_update_timer")),
                "load1": os.getloadavg()[0],
            }
            for key in ("weight_entropy", "max_weight", "policy_entropy", "entropy", "grad_clip_norm_is_applied"):
                if key in learner:
                    row[key] = num(learner[key])
            iters.append(row)
            row["return_last_episodes"] = last_episodes_mean(iters, args.window)
            if row["return_last_episodes"] is not None and row["return_last_episodes"] >= args.target \
                    and t <= args.budget_s:
                solved_at = row
                break
            if t >= args.budget_s:
                break
    except Exception as err:  # noqa: BLE001 - a crashed run is a result, reported as such
        error = f"{type(err).__name__}: {err}"
        print(f"[{algo_name} seed {seed}] crashed: {error}", file=sys.stderr, flush=True)
    finally:
        train_s = time.perf_counter() - t0
        t_stop = time.perf_counter()
        algo.stop()
        stop_s = time.perf_counter() - t_stop

    last = iters[-1] if iters else {}
    steps = last.get("env_steps", 0)
    grad_steps = clocks["grad_steps"].calls
    run = {
        "algo": algo_name,
        "seed": seed,
        "solved": solved_at is not None,
        "time_to_solve_s": solved_at["t"] if solved_at else None,
        "env_steps_to_solve": solved_at["env_steps"] if solved_at else None,
        "iters_to_solve": solved_at["iter"] if solved_at else None,
        "build_s": round(build_s, 3),
        "train_s": round(train_s, 3),
        "stop_s": round(stop_s, 3),
        "iterations": len(iters),
        "env_steps": steps,
        "grad_steps": grad_steps,
        "env_steps_per_s": steps / train_s if train_s > 0 else None,
        "learner_updates_per_s": grad_steps / train_s if train_s > 0 else None,
        "sample_s": clocks["sample"].seconds,
        "learner_update_s": clocks["learner_update"].seconds,
        "sampling_steps_per_s": steps / clocks["sample"].seconds if clocks["sample"].seconds else None,
        "timer_sampling_last_s": last.get("timer_sampling_s"),
        "timer_learner_update_last_s": last.get("timer_learner_update_s"),
        "final_return_mean": last.get("return_mean"),
        "best_return_mean": max((r["return_last_episodes"] for r in iters
                                 if r.get("return_last_episodes") is not None), default=None),
        "load1_mean": statistics.fmean(r["load1"] for r in iters) if iters else None,
        "error": error,
        "iters": iters,
    }
    if any("weight_entropy" in r for r in iters):
        we = [r["weight_entropy"] for r in iters if r.get("weight_entropy") is not None]
        run["weight_entropy_min"] = min(we) if we else None
        run["weight_entropy_last"] = we[-1] if we else None
        run["weight_entropy_near_zero_iters"] = sum(w < 0.05 for w in we)
    return run


# ----------------------------------------------------------------------------- summary


def median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(runs: list[dict], budget_s: float) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for algo in sorted({r["algo"] for r in runs}, key=list(CONFIGS).index):
        rs = [r for r in runs if r["algo"] == algo]
        out[algo] = {
            "runs": len(rs),
            "solved": sum(r["solved"] for r in rs),
            # unsolved runs count as the budget (time) and as their steps at budget end
            "median_time_to_solve_s": median([r["time_to_solve_s"] if r["solved"] else budget_s for r in rs]),
            "median_env_steps_to_solve": median(
                [r["env_steps_to_solve"] if r["solved"] else r["env_steps"] for r in rs]
            ),
            "median_iters_to_solve": median([r["iters_to_solve"] if r["solved"] else r["iterations"] for r in rs]),
            "median_env_steps_per_s": median([r["env_steps_per_s"] for r in rs]),
            "median_sampling_steps_per_s": median([r["sampling_steps_per_s"] for r in rs]),
            "median_learner_updates_per_s": median([r["learner_updates_per_s"] for r in rs]),
            "median_build_s": median([r["build_s"] for r in rs]),
            "sample_share": median([r["sample_s"] / r["train_s"] for r in rs if r["train_s"]]),
            "learner_share": median([r["learner_update_s"] / r["train_s"] for r in rs if r["train_s"]]),
            "median_timer_sampling_s": median([r["timer_sampling_last_s"] for r in rs]),
            "median_timer_learner_update_s": median([r["timer_learner_update_last_s"] for r in rs]),
            "median_load1": median([r["load1_mean"] for r in rs]),
        }
    for h, p in pairs(out):
        out[f"{h}/{p}"] = {
            k: (out[h][k] / out[p][k] if out[h][k] is not None and out[p][k] else None)
            for k in (
                "median_time_to_solve_s",
                "median_env_steps_to_solve",
                "median_env_steps_per_s",
                "median_learner_updates_per_s",
                "median_build_s",
            )
        }
    return out


def pairs(setups) -> list[tuple[str, str]]:
    """(HAEPO set-up, PPO set-up) for each pair among ``setups``, in CONFIGS order."""
    names = [a for a in CONFIGS if a in setups]
    return [(h, p) for h in names if h.startswith("HAEPO") for p in names if p.startswith("PPO")]


def fmt(x: Any, spec: str = ".0f") -> str:
    return "-" if x is None else format(x, spec)


def print_table(runs: list[dict], summary: dict, args: argparse.Namespace) -> str:
    lines = ["", "per run:", "| algo | seed | solved | time to solve (s) | env steps to solve | iters | env steps/s | updates/s | build (s) | sample / learner (s) | best R | min H(w) | load |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(
            f"| {r['algo']} | {r['seed']} | {'yes' if r['solved'] else 'no' + (' (crash)' if r['error'] else '')} "
            f"| {fmt(r['time_to_solve_s'], '.1f')} | {fmt(r['env_steps_to_solve'], 'd')} | {r['iterations']} "
            f"| {fmt(r['env_steps_per_s'])} | {fmt(r['learner_updates_per_s'], '.1f')} | {r['build_s']:.1f} "
            f"| {r['sample_s']:.0f} / {r['learner_update_s']:.0f} | {fmt(r['best_return_mean'], '.0f')} "
            f"| {fmt(r.get('weight_entropy_min'), '.2f')} | {fmt(r['load1_mean'], '.1f')} |"
        )
    lines += [
        "",
        f"medians (unsolved runs count as the budget, {args.budget_s:.0f} s, and their env steps at budget end):",
        "| algo | solved | time to solve (s) | env steps to solve | env steps/s | sampling-only steps/s | learner updates/s | build (s) | time in sampling / learner | load (1-min avg) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    setups = [a for a in CONFIGS if a in summary]
    for algo in setups:
        s = summary[algo]
        lines.append(
            f"| {algo} | {s['solved']}/{s['runs']} | {fmt(s['median_time_to_solve_s'], '.1f')} "
            f"| {fmt(s['median_env_steps_to_solve'], '.0f')} | {fmt(s['median_env_steps_per_s'])} "
            f"| {fmt(s['median_sampling_steps_per_s'])} | {fmt(s['median_learner_updates_per_s'], '.1f')} "
            f"| {fmt(s['median_build_s'], '.1f')} | {fmt(100 * s['sample_share'], '.0f')}% / "
            f"{fmt(100 * s['learner_share'], '.0f')}% | {fmt(s['median_load1'], '.1f')} |"
        )
    targets = []
    for h_name, p_name in pairs(setups):
        q = summary[f"{h_name}/{p_name}"]
        lines.append(
            f"| {h_name}/{p_name} | | {fmt(q['median_time_to_solve_s'], '.2f')} | {fmt(q['median_env_steps_to_solve'], '.3f')} "
            f"| {fmt(q['median_env_steps_per_s'], '.2f')} | | {fmt(q['median_learner_updates_per_s'], '.3f')} "
            f"| {fmt(q['median_build_s'], '.2f')} | | |"
        )
        ratio = q["median_time_to_solve_s"]
        if ratio is not None:
            met = ratio <= 0.5
            h, p = summary[h_name], summary[p_name]
            h_cens = h["solved"] * 2 <= h["runs"]  # median itself is a censored (budget) value
            p_cens = p["solved"] * 2 <= p["runs"]
            caveat = ""
            if p_cens and h_cens:
                caveat = " -- both medians are censored at the budget: the ratio says nothing"
            elif p_cens:
                caveat = f" -- {p_name}'s median is censored at the budget: the true ratio is lower (an upper bound)"
            elif h_cens:
                caveat = f" -- {h_name}'s median is censored at the budget: the true ratio is higher (a lower bound)"
            targets.append(
                f"target {h_name} time-to-solve <= 0.5 x {p_name}'s: {'MET' if met else 'NOT MET'} "
                f"(ratio {ratio:.2f}){caveat}"
            )
    if targets:
        lines += ["", *targets]
    for algo in setups:
        s = summary[algo]
        lines.append(
            f"RLlib timers ({algo}, smoothed, per iteration, last value, median over runs): "
            f"env_runner_sampling_timer {fmt(s['median_timer_sampling_s'], '.3f')} s, "
            f"learner_update_timer {fmt(s['median_timer_learner_update_s'], '.3f')} s"
        )
    text = "\n".join(lines)
    print(text, flush=True)
    return text


# ----------------------------------------------------------------------------- main


def machine_info() -> dict:
    def sh(cmd: list[str]) -> str | None:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
        except Exception:  # noqa: BLE001
            return None

    import ray
    import torch

    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host_cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "ray": ray.__version__,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "git_head": sh(["git", "rev-parse", "--short", "HEAD"]),
        "uptime": sh(["uptime"]),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import ray
    import torch

    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)

    info = machine_info()
    print(f"{info['date']}  cpus={info['host_cpus']}  {info['uptime']}", flush=True)
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=True, logging_level="WARNING")
    runs: list[dict] = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save(summary=None, table=None) -> None:
        payload = {
            "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
            "args": vars(args),
            "machine": info,
            "summary": summary,
            "table": table,
            "runs": runs,
        }
        text = json.dumps(payload, indent=1)
        out.write_bytes(gzip.compress(text.encode(), mtime=0) if out.suffix == ".gz" else text.encode())

    # Untimed warm-up build of each algorithm: the first build in a process pays for
    # imports and Ray actor/metric set-up, which would otherwise land on HAEPO seed 0 only.
    for algo in args.algos:
        CONFIGS[algo](args.seeds[0], args).build_algo().stop()

    try:
        for seed in args.seeds:
            for algo in args.algos:
                print(f"--- {algo} seed {seed} (load {os.getloadavg()[0]:.1f}) ---", flush=True)
                r = run_one(algo, seed, args)
                runs.append(r)
                print(
                    f"{algo} seed {seed}: solved={r['solved']} t={fmt(r['time_to_solve_s'], '.1f')}s "
                    f"steps={fmt(r['env_steps_to_solve'], 'd')} iters={r['iterations']} "
                    f"best={fmt(r['best_return_mean'], '.1f')} build={r['build_s']:.1f}s "
                    f"steps/s={fmt(r['env_steps_per_s'])} updates/s={fmt(r['learner_updates_per_s'], '.1f')} "
                    f"sample={r['sample_s']:.1f}s learner={r['learner_update_s']:.1f}s load={fmt(r['load1_mean'], '.1f')}",
                    flush=True,
                )
                save()
    finally:
        info["uptime_end"] = machine_info()["uptime"]
        summary = summarize(runs, args.budget_s) if runs else None
        table = print_table(runs, summary, args) if summary else None
        save(summary, table)
        print(f"results: {out}", flush=True)
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
