"""Sampling speed of HAEPO's env runner on envs whose observations are not a Box: the lean
path, which flattens them as RLlib's ``FlattenObservations`` does, against RLlib's loop, where
such envs were sampled before (one env: RLlib's loop; several: HAEPO's round sampler, the
unbiased way through that loop).

The same runner and MLP-128 policy (initial weights) as ``bench/sampling_speed.py``, torch on
one thread, one process; N envs per runner, M = 8 episodes per batch. Repetitions are
interleaved (A B A B ...); each ratio is taken within a repetition, and the median (min - max)
over repetitions is reported, per second of the sampling thread's CPU time and of wall time.

    python bench/non_box_sampling.py [--envs FrozenLake-v1 Taxi-v3 Blackjack-v1] [--n 1 8]
                                     [--reps 5] [--steps 2000]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable

from sampling_speed import CLOCKS, haepo_runner, interleaved_rates

PATHS = {"lean path": True, "RLlib's loop": False}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", nargs="+", default=["FrozenLake-v1", "Taxi-v3", "Blackjack-v1"])
    p.add_argument("--n", type=int, nargs="+", default=[1, 8], help="N, envs per runner")
    p.add_argument("--m", type=int, default=8, help="M, episodes per batch")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--steps", type=int, default=2000, help="env steps per set-up and repetition (at least)")
    p.add_argument("--out", default="bench/results/non_box_sampling.json")
    args = p.parse_args()

    import ray
    import torch

    torch.set_num_threads(1)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    algos: list = []
    setups: dict[tuple[str, int, str], Callable[[], int]] = {
        (env, n, path): haepo_runner(n, args.steps, lean, algos, env, args.m)
        for env in args.envs for n in args.n for path, lean in PATHS.items()}
    rates, load_start, load_end = interleaved_rates(setups, args.reps)
    for algo in algos:
        algo.stop()
    ray.shutdown()

    print(f"load average (1, 5, 15 min) at the start {load_start}, at the end {load_end}")
    print("| env | N | lean path, env steps/s | RLlib's loop, env steps/s | lean / loop, thread CPU "
          "(median, min - max) | lean / loop, wall |")
    print("|---|---|---|---|---|---|")
    summary = []
    for env in args.envs:
        for n in args.n:
            row = {"env": env, "n": n}
            for clock in CLOCKS:
                lean, loop = rates[clock][(env, n, "lean path")], rates[clock][(env, n, "RLlib's loop")]
                ratios = [a / b for a, b in zip(lean, loop)]
                row[clock] = {"lean": statistics.median(lean), "loop": statistics.median(loop),
                              "ratio": (statistics.median(ratios), min(ratios), max(ratios))}
            cpu, wall = row["thread CPU time"], row["wall-clock time"]
            print(f"| {env} | {n} | {cpu['lean']:,.0f} | {cpu['loop']:,.0f} | **{cpu['ratio'][0]:.1f}x** "
                  f"({cpu['ratio'][1]:.1f} - {cpu['ratio'][2]:.1f}) | {wall['ratio'][0]:.1f}x "
                  f"({wall['ratio'][1]:.1f} - {wall['ratio'][2]:.1f}) |")
            summary.append(row)
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "summary": summary, "load_start": load_start, "load_end": load_end}, f,
                  indent=2)


if __name__ == "__main__":
    main()
