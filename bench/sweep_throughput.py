"""Sweep throughput of ``haepo sweep`` on this machine: trials per minute, per-trial overhead,
and the time of the paper's full HAEPO bandit grid. Results: BENCHMARKS.md.

    python bench/sweep_throughput.py parts            # where a trial's fixed cost goes
    python bench/sweep_throughput.py tiny             # 16 tiny bandit trials, 3 set-ups
    python bench/sweep_throughput.py paper-bandit     # tune_configs/paper/bandit_k{10,20,30}_haepo.yaml
    python bench/sweep_throughput.py all              # the three, in this order
    python bench/sweep_throughput.py iterations --code ../base .   # A/B: training iterations

``iterations`` times training iterations of one paper bandit trial (K = 10, lr 1e-3, seed 0,
M = 8 and 32: 32 and 8 HAEPO updates per iteration) with the haepo_ray of each ``--code``
folder (a checkout, e.g. a ``git worktree`` of main), one fresh process per measurement,
the folders taking turns, and gives each folder's medians as ratios to the first one's.
Each process runs torch on one thread, as a Tune trial with ``cpus: 1`` does (Ray sets
OMP_NUM_THREADS=1 there), and reports wall time and the CPU time of its main thread (which
runs the whole iteration; steadier than wall time on a shared machine).

Every run uses one embedded Ray with ``--num-cpus`` CPUs (default 2), started once and not
counted. A trial's *overhead* is its share of the sweep's wall time minus the time it spent
inside training iterations::

    overhead = wall_time * concurrent_trials / num_trials - mean(time_total_s)

(``time_total_s``: Tune's sum of the trial's iteration times), also without the sweep's
start-up (until the first trial runs). It holds everything else:
actor start (a new process importing Ray, RLlib, PyTorch), building the algorithm,
checkpoints, result handling, Tune's scheduling, MLflow logging (async, on the driver).
JSON results go to ``--out`` (default .haepo/bench/sweep_throughput.json).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def load() -> str:
    try:
        return "load average %.2f %.2f %.2f" % os.getloadavg()
    except OSError:  # pragma: no cover
        return "load average n/a"


# --------------------------------------------------------------------------- parts


def bench_parts(repeats: int = 3) -> dict:
    """The fixed costs of one trial, measured alone."""
    imports = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import haepo_ray.rl.algorithm"], check=True,
                       capture_output=True)
        imports.append(time.perf_counter() - t)

    from haepo_ray import HAEPOConfig

    config = (
        HAEPOConfig()
        .environment("haepo/GaussianBandit-v0", env_config={"num_arms": 10})
        .env_runners(num_env_runners=0, num_envs_per_env_runner=8)
        .training(episodes_per_batch=8, lr=1e-3)
        .rl_module(model_config={"fcnet_hiddens": [16]})
        .debugging(seed=0)
    )
    builds, saves, stops, iters = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            t = time.perf_counter()
            algo = config.build_algo()
            builds.append(time.perf_counter() - t)
            algo.train()  # warm-up
            t = time.perf_counter()
            for _ in range(20):
                algo.train()
            iters.append((time.perf_counter() - t) / 20)
            t = time.perf_counter()
            algo.save_to_path(f"{tmp}/ckpt{i}")
            saves.append(time.perf_counter() - t)
            t = time.perf_counter()
            algo.stop()
            stops.append(time.perf_counter() - t)
    med = statistics.median
    return {
        "process_start_and_import_s": med(imports),
        "build_algo_first_s": builds[0],
        "build_algo_warm_s": med(builds[1:]),
        "train_iteration_s": med(iters),
        "save_checkpoint_s": med(saves),
        "stop_algo_s": med(stops),
    }


# --------------------------------------------------------------------------- iterations


def iterations_child(batch_size: int, iterations: int) -> dict:
    """Times ``iterations`` training iterations of one bandit_k10_haepo trial (in this process,
    with the haepo_ray on PYTHONPATH)."""
    import ray
    import torch

    torch.set_num_threads(1)
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    from haepo_ray.envs import register_with_ray
    from haepo_ray.sweep.kinds import load_plan

    register_with_ray()
    plan = load_plan(Path.cwd() / "tune_configs" / "paper" / "bandit_k10_haepo.yaml")
    algo = plan.trial_config({"lr": 1e-3, "batch_size": batch_size, "seed": 0}).build_algo()
    algo.train()  # warm-up
    walls, cpus = [], []
    for _ in range(iterations):
        wall, cpu = time.perf_counter(), time.thread_time()
        result = algo.train()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.thread_time() - cpu)
    updates = result["learners"]["__all_modules__"]["num_env_steps_trained"] / batch_size
    algo.stop()
    ray.shutdown()
    med = statistics.median
    return {"wall_s": med(walls), "cpu_s": med(cpus), "updates_per_iteration": updates}


def bench_iterations(code: list[str], batch_sizes: list[int], repeats: int, iterations: int) -> dict:
    """The folders in turn, ``repeats`` times; medians and ratios to ``code[0]``."""
    runs: dict = {(c, m): [] for c in code for m in batch_sizes}
    for r in range(repeats):
        for m in batch_sizes:
            for c in code:
                env = {**os.environ, "PYTHONPATH": str(Path(c).resolve())}
                out = subprocess.run(
                    [sys.executable, str(Path(__file__).resolve()), "iterations-child",
                     "--batch-size", str(m), "--iterations", str(iterations)],
                    cwd=c, env=env, check=True, capture_output=True, text=True,
                ).stdout
                row = {**json.loads(out.strip().splitlines()[-1]), "load": load()}
                runs[(c, m)].append(row)
                print(json.dumps({"repeat": r, "code": c, "batch_size": m, **row}), flush=True)
    table = []
    for m in batch_sizes:
        base = {k: statistics.median(x[k] for x in runs[(code[0], m)]) for k in ("wall_s", "cpu_s")}
        for c in code:
            rows = runs[(c, m)]
            wall = statistics.median(x["wall_s"] for x in rows)
            cpu = statistics.median(x["cpu_s"] for x in rows)
            n = rows[0]["updates_per_iteration"]
            table.append({"code": c, "batch_size": m, "updates_per_iteration": n,
                          "iteration_wall_s": wall, "iteration_cpu_s": cpu,
                          "update_wall_ms": 1e3 * wall / n, "update_cpu_ms": 1e3 * cpu / n,
                          "wall_ratio": wall / base["wall_s"], "cpu_ratio": cpu / base["cpu_s"]})
            print(json.dumps(table[-1]), flush=True)
    return {"runs": {f"{c} M={m}": rows for (c, m), rows in runs.items()}, "table": table}


# --------------------------------------------------------------------------- sweeps


def tiny_spec(name: str, reuse: bool, iterations: int = 3):
    from haepo_ray.sweep.kinds import parse_plan

    return parse_plan({
        "name": name,
        "algorithm": "HAEPO",
        "env": "haepo/GaussianBandit-v0",
        "env_config": {"num_arms": 10},
        "settings": {"num_env_runners": 0, "model_config": {"fcnet_hiddens": [16]},
                     "beta_ent": 0.05, "beta_kl": 0.05},
        "search_space": {"lr": {"grid": [1e-3, 2e-3]}, "batch_size": {"grid": [8, 16]},
                         "seed": {"grid": [0, 1, 2, 3]}},
        "stop": {"iterations": iterations},
        "reuse_actors": reuse,
        "checkpoint_at_end": True,
    }, f"{name}.yaml")


class Timeline:
    """Driver-side times of trial starts, results and ends (a Tune callback)."""

    def __new__(cls):
        from ray import tune

        class _Timeline(tune.Callback):
            def __init__(self):
                self.events: list[tuple[float, str, str, Any]] = []

            def on_trial_start(self, iteration, trials, trial, **info):
                self.events.append((time.time(), "start", trial.trial_id, None))

            def on_trial_result(self, iteration, trials, trial, result, **info):
                self.events.append((time.time(), "result", trial.trial_id,
                                    (result.get("pid"), result.get("time_this_iter_s", 0.0))))

            def on_trial_complete(self, iteration, trials, trial, **info):
                self.events.append((time.time(), "complete", trial.trial_id, None))

        return _Timeline()


def split_overhead(events: list, t0: float) -> dict:
    """Where a trial's time outside its iterations goes, from the driver's timeline."""
    per: dict[str, list] = {}
    for ts, kind, tid, info in events:
        per.setdefault(tid, []).append((ts, kind, info))
    pid_of, first_result, between, tail = {}, [], [], []
    for tid, evs in per.items():
        results = [e for e in evs if e[1] == "result"]
        starts = [e[0] for e in evs if e[1] == "start"]
        ends = [e[0] for e in evs if e[1] == "complete"]
        if not results or not starts or not ends:
            continue
        pid_of[tid] = results[0][2][0]
        first_result.append(results[0][0] - starts[-1] - results[0][2][1])
        between += [b[0] - a[0] - b[2][1] for a, b in zip(results, results[1:])]
        tail.append(ends[-1] - results[-1][0])
    gaps, last_end = [], {}
    for ts, kind, tid, _ in events:
        pid = pid_of.get(tid)
        if pid is None:
            continue
        if kind == "start" and pid in last_end:
            gaps.append(ts - last_end.pop(pid))
        elif kind == "complete":
            last_end[pid] = ts
    mean = lambda xs: statistics.mean(xs) if xs else None  # noqa: E731
    starts = [ts for ts, kind, _, _ in events if kind == "start"]
    return {
        "startup_s": (min(starts) - t0) if starts else None,
        "actors": len(set(pid_of.values())),
        "start_to_first_result_s": mean(first_result),
        "per_result_s": mean(between),
        "last_result_to_end_s": mean(tail),
        "end_to_next_start_same_actor_s": mean(gaps),
    }


def run_one(plan, root: Path, track: bool, slots: int) -> dict:
    from haepo_ray.sweep.runner import run_sweep

    spec = plan.spec
    uri = f"sqlite:///{root / 'mlflow.db'}"
    timeline = Timeline()
    t0 = time.time()
    t = time.perf_counter()
    result = run_sweep(plan, tracking_uri=uri, track=track, storage_path=str(root / "results"),
                       out=io.StringIO(), verbose=0, extra_callbacks=[timeline])
    wall = time.perf_counter() - t
    split = split_overhead(timeline.events, t0)
    startup = split["startup_s"] or 0.0
    train = [float((r.metrics or {}).get("time_total_s", 0.0)) for r in result.result_grid]
    n = len(result.trials)
    statuses = {t.status for t in result.trials}
    return {
        "spec": spec.name,
        "trials": n,
        "statuses": sorted(statuses),
        "reuse_actors": spec.reuse_actors,
        "mlflow": track,
        "wall_s": wall,
        "trials_per_min": 60.0 * n / wall,
        "mean_train_s": statistics.mean(train),
        "overhead_per_trial_s": wall * slots / n - statistics.mean(train),
        # Until the first trial runs: Tune set-up, MLflow parent run, the first actor's
        # process start and imports, the first algorithm build. Paid once per sweep.
        "overhead_per_trial_after_startup_s": (wall - startup) * slots / n - statistics.mean(train),
        **split,
        "not_logged": len(result.not_logged),
    }


def bench_tiny(root: Path, slots: int) -> list[dict]:
    rows = []
    for name, reuse, track in (("tiny_fresh", False, False), ("tiny_reuse", True, False),
                               ("tiny_reuse_mlflow", True, True)):
        row = run_one(tiny_spec(name, reuse), root, track, slots)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def bench_paper_bandit(root: Path, slots: int, ks: list[int], track: bool = True) -> list[dict]:
    from haepo_ray.sweep.kinds import load_plan

    rows = []
    for k in ks:
        plan = load_plan(REPO / "tune_configs" / "paper" / f"bandit_k{k}_haepo.yaml")
        row = run_one(plan, root, track, slots)
        print(json.dumps(row), flush=True)
        rows.append(row)
    total = sum(r["wall_s"] for r in rows)
    print(json.dumps({"paper_bandit_total_s": total, "trials": sum(r["trials"] for r in rows)}), flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["parts", "tiny", "paper-bandit", "all", "iterations",
                                         "iterations-child"])
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--ks", type=int, nargs="+", default=[10, 20, 30])
    parser.add_argument("--no-mlflow", action="store_true", help="paper-bandit without MLflow")
    parser.add_argument("--code", nargs="+", default=[str(REPO)],
                        help="iterations: checkouts to compare, the first is the baseline")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=8, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None,
                        help="JSON results (default .haepo/bench/sweep_throughput[_iterations].json)")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if args.what == "iterations-child":
        print(json.dumps(iterations_child(args.batch_size, args.iterations)))
        return 0
    out = Path(args.out or REPO / ".haepo" / "bench" / (
        "sweep_throughput_iterations.json" if args.what == "iterations" else "sweep_throughput.json"))
    if args.what == "iterations":
        report = {"load_before": load(),
                  **bench_iterations(args.code, args.batch_sizes, args.repeats, args.iterations),
                  "load_after": load()}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2))
        print(f"results: {out}")
        return 0

    import ray

    report: dict = {"machine": f"{platform.node()} {os.cpu_count()} cores, python {platform.python_version()}",
                    "ray": ray.__version__, "num_cpus": args.num_cpus, "load_before": load()}
    t = time.perf_counter()
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    report["ray_init_s"] = time.perf_counter() - t
    from haepo_ray.envs import register_with_ray

    register_with_ray()
    with tempfile.TemporaryDirectory(prefix="haepo-bench-") as tmp:
        root = Path(tmp)
        if args.what in ("parts", "all"):
            report["parts"] = bench_parts()
            print(json.dumps(report["parts"]), flush=True)
        if args.what in ("tiny", "all"):
            report["tiny"] = bench_tiny(root, args.num_cpus)
        if args.what in ("paper-bandit", "all"):
            report["paper_bandit"] = bench_paper_bandit(root, args.num_cpus, args.ks, not args.no_mlflow)
    report["load_after"] = load()
    ray.shutdown()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
