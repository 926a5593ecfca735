"""Sampling speed of HAEPO's env runner against the machine's ceiling and RLlib's loop.

Every set-up samples CartPole-v1 with the same MLP-128 policy, torch on one thread, in one
process: ``--policy initial`` (default; random weights, episodes of about 22 steps) or
``--policy balancing`` (weights set by hand to a stochastic pole-balancing controller,
episodes of about 490 steps, as late in a CartPole training run). Repetitions are
interleaved (A B C ... A B C ...) so that drift in the machine's load hits all set-ups;
each ratio is taken within a repetition, then the median over repetitions is reported.
Rates are given per second of the main thread's CPU time (robust on a shared machine:
all the sampling work runs in that thread) and per second of wall-clock time.

- ``ceiling, N envs``: no RLlib. A plain loop over ``gymnasium.make_vec("CartPole-v1",
  num_envs=N)`` (gymnasium's numpy-vectorised CartPole) with one batched forward pass of
  the same MLP per step, ``torch.distributions.Categorical`` sampling and log-prob (no
  argument checks, as in HAEPO's lean path);
  every step of every sub-env counts (autoreset, episodes never wait for each other).
- ``whole-batch ceiling, N envs``: the same loop, but as HAEPO needs its data: reset, then
  step until the N episodes that started are all complete, counting their steps only. With
  M = N episodes per batch a batch lasts as long as its longest episode, while the
  finished sub-envs wait; no sampler of complete on-policy batches can beat this.
- ``HAEPO runner, N envs, M = N``: ``HAEPOEnvRunner.sample(num_episodes=M)`` (lean path).
- ``RLlib's loop, N envs``: the same runner forced onto RLlib's loop (a callback with a
  per-step hook; with several envs it samples in HAEPO's rounds), for reference.

    python bench/sampling_speed.py [--reps 7] [--steps 4000] [--envs 8 16] [--rllib-loop]
    python bench/sampling_speed.py --profile 16    # where the runner's time goes, N = M = 16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

import numpy as np


BALANCING = ([0.1, 0.5, 1.0, 0.5], 20.0)  # P(push right) = sigmoid(20 * w . obs)


def make_balancing(linears: list) -> None:
    """Sets an MLP obs-128-2 (its two Linear layers) to the balancing controller: hidden
    units 0 and 1 are relu(+-w . obs), logit(right) - logit(left) = k * w . obs."""
    import torch

    (w, k), (hidden, out) = BALANCING, linears
    with torch.no_grad():
        for layer in linears:
            layer.weight.zero_()
            layer.bias.zero_()
        hidden.weight[0] = torch.tensor(w)
        hidden.weight[1] = -torch.tensor(w)
        out.weight[1, 0], out.weight[1, 1] = k, -k


POLICY = {"name": "initial"}  # set from --policy


def linear_layers(module) -> list:
    import torch

    layers = [m for m in module.modules() if isinstance(m, torch.nn.Linear)]
    assert len(layers) == 2, layers
    return layers


def plain_policy(seed: int):
    """The MLP-128 policy as a user without RLlib writes it: obs -> (actions, log-probs)."""
    import torch

    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(4, 128), torch.nn.ReLU(), torch.nn.Linear(128, 2))
    if POLICY["name"] == "balancing":
        make_balancing(linear_layers(net))

    def act(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad():
            dist = torch.distributions.Categorical(logits=net(torch.as_tensor(obs)), validate_args=False)
            actions = dist.sample()
            return actions.numpy(), dist.log_prob(actions).numpy()

    return act


def ceiling(n: int, steps: int) -> Callable[[], int]:
    """One repetition of the plain autoreset loop: at least ``steps`` env steps."""
    import gymnasium as gym

    env, act = gym.make_vec("CartPole-v1", num_envs=n), plain_policy(0)
    obs = env.reset(seed=0)[0]

    def run() -> int:
        nonlocal obs
        for _ in range(-(-steps // n)):
            actions, _ = act(obs)
            obs = env.step(actions)[0]
        return -(-steps // n) * n

    return run


def whole_batch_ceiling(n: int, steps: int) -> Callable[[], int]:
    """One repetition of the plain loop sampling batches of n complete episodes."""
    import gymnasium as gym

    env, act = gym.make_vec("CartPole-v1", num_envs=n), plain_policy(0)
    env.reset(seed=0)

    def run() -> int:
        counted = 0
        while counted < steps:
            obs, done = env.reset()[0], np.zeros(n, bool)
            while not done.all():
                actions, _ = act(obs)
                obs, _, terminated, truncated, _ = env.step(actions)
                counted += int((~done).sum())
                done |= terminated | truncated
        return counted

    return run


def haepo_runner(n: int, steps: int, lean: bool, algos: list, env: str = "CartPole-v1", m: int | None = None):
    """One repetition of ``HAEPOEnvRunner.sample(num_episodes=m)`` batches (M = N unless given),
    N envs of ``env``: >= ``steps``."""
    m = m or n
    from haepo_ray import HAEPOConfig
    from haepo_ray.rl.callbacks import EpisodeInfoMetrics

    class PerStep(EpisodeInfoMetrics):
        def on_episode_step(self, **kwargs) -> None:
            pass

    config = (
        HAEPOConfig().environment(env)
        .env_runners(num_env_runners=0, num_envs_per_env_runner=n)
        .rl_module(model_config={"fcnet_hiddens": [128]})
        .callbacks(EpisodeInfoMetrics if lean else PerStep)
        .training(episodes_per_batch=m)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    algos.append(algo)
    runner = algo.env_runner_group.local_env_runner
    assert (runner.lean_path_blocker() is None) == lean
    if POLICY["name"] == "balancing":
        make_balancing(linear_layers(runner.module))

    def run() -> int:
        counted = 0
        while counted < steps:
            counted += sum(len(e) for e in runner.sample(num_episodes=m))
        return counted

    return run


# Where the runner's time goes: (file name, function) whose cumulative time makes each part.
PROFILE_PARTS = {
    "vector env step": [("cartpole.py", "step")],
    "module forward pass": [("torch_rl_module.py", "_forward_exploration")],
    "action distribution (build, sample, log-prob)": [
        ("torch_distribution.py", "from_logits"), ("torch_distribution.py", "sample"),
        ("torch_distribution.py", "logp")],
    "observations to tensor": [("lean.py", "to_tensor")],
    "cutting episodes out of the step log": [("lean.py", "cut")],
    "SingleAgentEpisode objects, on_episode_end": [("env_runner.py", "_to_episode")],
    "RLlib's sampling metrics": [("rllib.py", "record_sampled")],
}


def profile(n: int, batches: int) -> None:
    """cProfile of ``batches`` runner batches (N = M = n), grouped into PROFILE_PARTS."""
    import cProfile
    import pstats

    import ray
    import torch

    torch.set_num_threads(1)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    algos: list = []
    run = haepo_runner(n, 1, True, algos)
    run()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(batches):
        run()
    profiler.disable()
    cumulative: dict[tuple[str, str], float] = {}
    for (filename, _, function), (_, _, _, cum, _) in pstats.Stats(profiler).stats.items():
        key = (os.path.basename(filename), function)
        cumulative[key] = cumulative.get(key, 0.0) + cum
    total = cumulative[("env_runner.py", "sample")]
    print(f"load average {os.getloadavg()}; {batches} batches, {total:.2f} s under cProfile")
    print("| part | share of HAEPOEnvRunner.sample |")
    print("|---|---|")
    parts = {name: sum(cumulative.get(key, 0.0) for key in keys) for name, keys in PROFILE_PARTS.items()}
    for name, seconds in parts.items():
        print(f"| {name} | {seconds / total:.0%} |")
    print(f"| the rest (step loop bookkeeping, RLlib's sample() around it) | {1 - sum(parts.values()) / total:.0%} |")
    for algo in algos:
        algo.stop()
    ray.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--steps", type=int, default=4000, help="env steps per set-up and repetition")
    p.add_argument("--envs", type=int, nargs="+", default=[8, 16], help="N (= M)")
    p.add_argument("--rllib-loop", action="store_true", help="also time RLlib's loop (slow)")
    p.add_argument("--out", default="bench/results/sampling_speed.json")
    p.add_argument("--policy", choices=["initial", "balancing"], default="initial")
    p.add_argument("--profile", type=int, metavar="N", help="only profile the runner with N = M envs")
    args = p.parse_args()
    POLICY["name"] = args.policy
    if args.profile:
        profile(args.profile, batches=60)
        return

    import ray
    import torch

    torch.set_num_threads(1)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    algos: list = []
    setups: dict[str, Callable[[], int]] = {}
    for n in args.envs:
        setups[f"ceiling, {n} envs"] = ceiling(n, args.steps)
        setups[f"whole-batch ceiling, {n} envs"] = whole_batch_ceiling(n, args.steps)
        setups[f"HAEPO runner, {n} envs, M = {n}"] = haepo_runner(n, args.steps, True, algos)
        if args.rllib_loop:
            setups[f"RLlib's loop, {n} envs, M = {n}"] = haepo_runner(n, args.steps // 4, False, algos)
    rates, load_start, load_end = interleaved_rates(setups, args.reps)
    for algo in algos:
        algo.stop()
    ray.shutdown()

    print(f"load average (1, 5, 15 min) at the start {load_start}, at the end {load_end}")
    summary = {clock: report(rates[clock], clock) for clock in CLOCKS}
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "rates": rates, "summary": summary,
                   "load_start": load_start, "load_end": load_end}, f, indent=2)


CLOCKS = {"thread CPU time": time.thread_time, "wall-clock time": time.perf_counter}


def interleaved_rates(setups: dict, reps: int) -> tuple[dict[str, dict], tuple, tuple]:
    """Each set-up (name -> a run returning the env steps it counted) warmed up once, then run
    ``reps`` times interleaved (A B C ... A B C ...): per clock of :data:`CLOCKS`, each set-up's
    env steps per second, one per repetition; with the load averages at the start and the end.
    The main thread's CPU time holds all the sampling work and, on a shared machine, does not
    count the time other processes hold the CPU."""
    for run in setups.values():  # warm-up
        run()
    load_start = os.getloadavg()
    rates: dict[str, dict] = {clock: {name: [] for name in setups} for clock in CLOCKS}
    for _ in range(reps):
        for name, run in setups.items():
            start = {clock: read() for clock, read in CLOCKS.items()}
            counted = run()
            for clock, read in CLOCKS.items():
                rates[clock][name].append(counted / (read() - start[clock]))
    return rates, load_start, os.getloadavg()


def report(rates: dict[str, list[float]], clock: str) -> dict:
    """Prints the table of one clock: medians and the per-repetition ratios' medians."""

    def ratio(name: str, base: str) -> tuple[float, float, float]:
        per_rep = [a / b for a, b in zip(rates[name], rates[base])]
        return statistics.median(per_rep), min(per_rep), max(per_rep)

    print(f"\nenv steps per second of {clock}")
    print("| set-up | env steps/s (median) | min - max | / ceiling (median, min - max) "
          "| / whole-batch ceiling |")
    print("|---|---|---|---|---|")
    summary = {}
    for name, values in rates.items():
        n = name.split(", ")[1]
        to_ceiling = ratio(name, f"ceiling, {n}")
        to_batch = ratio(name, f"whole-batch ceiling, {n}")
        summary[name] = {"median": statistics.median(values), "to_ceiling": to_ceiling, "to_whole_batch": to_batch}
        print(f"| {name} | {statistics.median(values):,.0f} | {min(values):,.0f} - {max(values):,.0f} "
              f"| {to_ceiling[0]:.2f} ({to_ceiling[1]:.2f} - {to_ceiling[2]:.2f}) "
              f"| {to_batch[0]:.2f} ({to_batch[1]:.2f} - {to_batch[2]:.2f}) |")
    return summary


if __name__ == "__main__":
    main()
