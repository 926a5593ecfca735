"""What the sweep's driver holds for each finished trial: the parts of Tune's ``Trial`` and of
haepo's own callbacks, in bytes of Python objects, after a real sweep of one-iteration HAEPO
trials (bench/scale.py's trial) through :func:`haepo_ray.sweep.runner.run_sweep`, MLflow on
SQLite. Results: BENCHMARKS.md, "Sweeps of thousands of trials".

    python bench/trial_memory.py --trials 40

Sizes are ``sys.getsizeof`` summed over each part's objects, each object counted once within
a part; the trial's parts are taken in the order printed and an object already counted by an
earlier part (``last_result["config"]`` is the trial's config) is not counted again. The
strings Tune caches for its experiment-state snapshots are parts of their own.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def deep_size(obj, seen: set[int]) -> int:
    """Bytes of ``obj`` and everything it holds that ``seen`` does not (``seen`` is updated)."""
    size, stack = 0, [obj]
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, type):
            continue
        seen.add(id(o))
        size += sys.getsizeof(o)
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)) or type(o).__name__ == "deque":
            stack.extend(o)
        elif hasattr(o, "__dict__") and not callable(o):
            stack.append(vars(o))
    return size


def trial_parts(trial) -> dict[str, int]:
    """Bytes of each part of one Tune ``Trial`` (see the module's docstring)."""
    from haepo_ray.upstream.tune import trial_caches

    meta, seen = trial.run_metadata, set()
    caches = trial_caches(trial)
    parts = {
        "config": trial.config,
        "unresolved config": caches["unresolved config"],
        "evaluated params": trial.evaluated_params,
        "metric_analysis": meta.metric_analysis,
        "metric_n_steps": meta.metric_n_steps,
        "last_result": meta.last_result,
        "cached JSON: trial state": caches["cached JSON: trial state"],
        "cached JSON: run metadata": caches["cached JSON: run metadata"],
    }
    out = {name: deep_size(part, seen) for name, part in parts.items()}
    out["rest of the Trial"] = deep_size(trial, seen)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=40)
    args = parser.parse_args()

    import ray

    from haepo_ray.sweep.kinds import parse_plan
    from haepo_ray.sweep.results import TrialRecorder
    from haepo_ray.sweep.runner import run_sweep
    from scale import spec_data

    work = Path(tempfile.mkdtemp(prefix="haepo-trial-memory-"))
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    recorder = TrialRecorder()
    callbacks: list = []
    import haepo_ray.sweep.runner as runner

    make_callback = runner.make_callback
    runner.make_callback = lambda *a, **k: callbacks.append(make_callback(*a, **k)) or callbacks[-1]
    plan = parse_plan(spec_data(args.trials, 4), "memory.yaml")
    run_sweep(plan, tracking_uri=f"sqlite:///{work / 'mlflow.db'}", storage_path=str(work / "results"),
              out=io.StringIO(), verbose=0, extra_callbacks=[recorder])
    trials = recorder.trials
    per_trial = [trial_parts(t) for t in trials]
    table = {k: statistics.median(p[k] for p in per_trial) for k in per_trial[0]}
    (callback,) = callbacks
    table["haepo MLflow callback (per trial)"] = deep_size(callback, set()) / len(trials)
    seen: set[int] = set()
    parts = {**{f"writer.{k}": v for k, v in vars(callback.writer).items()}, **vars(callback)}
    largest = {k: deep_size(v, seen) / len(trials) for k, v in parts.items()}
    print("the callback's largest attributes, bytes per trial:",
          {k: round(v) for k, v in sorted(largest.items(), key=lambda kv: -kv[1])[:6]})
    table["total"] = sum(table.values())
    print(json.dumps({"trials": len(trials), "bytes_per_finished_trial": table}, indent=1))
    ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
