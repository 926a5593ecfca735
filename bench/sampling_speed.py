"""Sampling speed of HAEPO's env runner: the lean path against RLlib's own loop, side by side.

Four set-ups sample batches of M = 8 complete CartPole-v1 episodes with the initial policy
(MLP 128): RLlib's loop and the lean path, each with 1 and with 8 envs per runner. RLlib's
loop is forced by a callback with a per-step hook (with 8 envs it runs HAEPO's round sampler).
Repetitions are interleaved (A B C D A B C D ...) so that drift in the machine's load hits
all four; the table gives the median env steps/s and the ratio to RLlib's loop with 1 env.

    python bench/sampling_speed.py [--reps 5] [--batches 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

SETUPS = {  # name -> (envs per runner, lean path)
    "rllib-loop, 1 env": (1, False),
    "lean, 1 env": (1, True),
    "rllib-loop, 8 envs": (8, False),
    "lean, 8 envs": (8, True),
}


def build(envs: int, lean: bool):
    from haepo_ray import HAEPOConfig
    from haepo_ray.callbacks import EpisodeInfoMetrics

    class PerStep(EpisodeInfoMetrics):
        def on_episode_step(self, **kwargs) -> None:
            pass

    config = (
        HAEPOConfig().environment("CartPole-v1")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=envs)
        .rl_module(model_config={"fcnet_hiddens": [128]})
        .callbacks(EpisodeInfoMetrics if lean else PerStep)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    runner = algo.env_runner_group.local_env_runner
    assert (runner._lean_path_blocker() is None) == lean
    return algo, runner


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--batches", type=int, default=20, help="batches of 8 episodes per repetition")
    p.add_argument("--out", default="bench/results/sampling_speed.json")
    args = p.parse_args()

    import ray
    import torch

    torch.set_num_threads(1)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    built = {name: build(*setup) for name, setup in SETUPS.items()}
    rates: dict[str, list[float]] = {name: [] for name in SETUPS}
    for name, (_, runner) in built.items():  # warm-up
        runner.sample(num_episodes=8)
    for _ in range(args.reps):
        for name, (_, runner) in built.items():
            steps, start = 0, time.perf_counter()
            for _ in range(args.batches):
                steps += sum(len(e) for e in runner.sample(num_episodes=8))
            rates[name].append(steps / (time.perf_counter() - start))
    for algo, _ in built.values():
        algo.stop()
    ray.shutdown()

    base = statistics.median(rates["rllib-loop, 1 env"])
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.1f}")
    print("| set-up | env steps/s (median) | min - max | ratio to RLlib's loop, 1 env |")
    print("|---|---|---|---|")
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"| {name} | {median:,.0f} | {min(values):,.0f} - {max(values):,.0f} | {median / base:.2f} |")
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "rates": rates, "load1_end": os.getloadavg()[0]}, f, indent=2)


if __name__ == "__main__":
    main()
