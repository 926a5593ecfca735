"""A reused trial actor's reset (``SweepTrainable.reset_config``: stop one algorithm, build the
next trial's), timed inside Tune's actors, with and without the optional RLlib patch of :mod:`haepo_ray.upstream.rllib`.
Results: BENCHMARKS.md, "Sweeps of thousands of trials".

    python bench/trial_reset.py                       # unpatched, patched, twice each
    python bench/trial_reset.py --trials 200 --variants patched

Each variant runs ``bench/scale.py``'s sweep (one-iteration HAEPO trials on the bandit) through
``run_sweep`` without MLflow, on a fresh local Ray with one slot, so that one actor runs every
trial; a ``worker_process_setup_hook`` wraps ``reset_config`` in each actor and appends its wall
and CPU time to a file. Prints the median reset and the sweep's wall time per variant.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from scale import spec_data  # noqa: E402


def timing_hook() -> None:
    """In each Ray worker: time ``reset_config``; ``HAEPO_BENCH_UNPATCHED`` turns the patches off."""
    from haepo_ray.sweep.kinds.rl import trainable

    if os.environ.get("HAEPO_BENCH_UNPATCHED"):
        os.environ["HAEPO_PATCHES"] = "required"  # the optional patches left out
    reset_config = trainable.SweepTrainable.reset_config

    def timed(self, config):
        wall, cpu = time.perf_counter(), time.process_time()
        done = reset_config(self, config)
        with open(os.environ["HAEPO_BENCH_RESET_LOG"], "a") as f:
            f.write(json.dumps([time.perf_counter() - wall, time.process_time() - cpu]) + "\n")
        return done

    trainable.SweepTrainable.reset_config = timed


def run(variant: str, trials: int) -> dict:
    import ray

    from haepo_ray.sweep.kinds import parse_plan
    from haepo_ray.sweep.runner import run_sweep

    work = Path(tempfile.mkdtemp(prefix="haepo-reset-"))
    log = work / "resets.jsonl"
    env = {"HAEPO_BENCH_RESET_LOG": str(log), **({"HAEPO_BENCH_UNPATCHED": "1"} if variant == "unpatched" else {})}
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False,
             runtime_env={"worker_process_setup_hook": timing_hook, "env_vars": env})
    try:
        t = time.perf_counter()
        run_sweep(parse_plan(spec_data(trials, 1), "reset.yaml"), track=False, storage_path=str(work / "results"),
                  out=io.StringIO(), verbose=0)
        wall = time.perf_counter() - t
    finally:
        ray.shutdown()
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    return {"variant": variant, "resets": len(rows),
            "reset_wall_ms": round(1000 * statistics.median(r[0] for r in rows), 1),
            "reset_cpu_ms": round(1000 * statistics.median(r[1] for r in rows), 1),
            "sweep_wall_s": round(wall, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=80)
    parser.add_argument("--variants", nargs="+", default=["unpatched", "patched", "unpatched", "patched"],
                        choices=["unpatched", "patched"])
    args = parser.parse_args(argv)
    for variant in args.variants:
        print(json.dumps(run(variant, args.trials)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
