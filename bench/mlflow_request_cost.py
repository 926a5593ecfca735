"""What a one-iteration trial's MLflow writes cost a real ``mlflow server`` (SQLite store, one
worker), request by request, in server CPU seconds: the requests the sweep's writer sends for
one trial, with the trial's params as the sweep logged them before (324) and now (14).
Results: BENCHMARKS.md, "Sweeps of thousands of trials".

    python bench/mlflow_request_cost.py               # 40 trials per variant
    python bench/mlflow_request_cost.py --trials 100 --params 324 14

The server's CPU time (psutil, its process and children) is read around each request, so
the figures hold on a loaded machine better than wall times (both printed).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers import MLflowServer  # noqa: E402

METRICS = 58  # a one-iteration HAEPO trial's metric keys (DEFAULT_METRICS matched)
TAGS = 15  # its tags at creation


def server_cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def measure(n_params: int, trials: int) -> dict:
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param, RunTag

    server = MLflowServer(Path(tempfile.mkdtemp(prefix="haepo-mlflow-cost-")))
    try:
        procs = [psutil.Process(server.proc.pid), *psutil.Process(server.proc.pid).children(recursive=True)]
        client = MlflowClient(server.uri)
        experiment = client.create_experiment("cost")
        parent = client.create_run(experiment).info.run_id
        costs: dict[str, list[float]] = {}

        def timed(kind: str, fn):
            cpu, wall = server_cpu(procs), time.perf_counter()
            out = fn()
            cost = costs.setdefault(kind, [0.0, 0.0, 0])
            cost[0] += server_cpu(procs) - cpu
            cost[1] += time.perf_counter() - wall
            cost[2] += 1
            return out

        params = [Param(f"section_{i // 20}/key_{i}", str(i * 0.1)) for i in range(n_params)]
        tags = {f"haepo.tag{i}": "x" * 20 for i in range(TAGS)}
        for r in range(trials):
            run_id = timed("create_run", lambda: client.create_run(
                experiment, tags={"mlflow.parentRunId": parent, **tags}).info.run_id)
            for i in range(0, n_params, 100):
                timed("log_batch params (100 a request)", lambda: client.log_batch(run_id, params=params[i:i + 100]))
            metrics = [Metric(f"m/key_{k}", k * 1.5, 1000 + r, 1) for k in range(METRICS)]
            timed(f"log_batch {METRICS} metrics + 10 tags", lambda: client.log_batch(
                run_id, metrics=metrics, tags=[RunTag(f"t{k}", "v") for k in range(10)]))
            timed("log_batch 3 tags", lambda: client.log_batch(run_id, tags=[RunTag(f"u{k}", "v") for k in range(3)]))
            timed("set_terminated", lambda: client.set_terminated(run_id, "FINISHED"))
    finally:
        server.kill()
    rows = {kind: {"requests_per_trial": round(n / trials, 2), "server_cpu_ms_per_trial": round(1000 * cpu / trials, 1),
                   "client_wall_ms_per_trial": round(1000 * wall / trials, 1)} for kind, (cpu, wall, n) in costs.items()}
    return {"params": n_params, "trials": trials, "requests": rows,
            "server_cpu_ms_per_trial": round(sum(r["server_cpu_ms_per_trial"] for r in rows.values()), 1),
            "client_wall_ms_per_trial": round(sum(r["client_wall_ms_per_trial"] for r in rows.values()), 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--params", type=int, nargs="+", default=[324, 14])
    args = parser.parse_args(argv)
    for n_params in args.params:
        print(json.dumps(measure(n_params, args.trials)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
