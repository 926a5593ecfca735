"""``haepo report`` over a sweep of many trials: wall time, CPU seconds and peak memory of the
CLI on a SQLite store and on an ``mlflow server`` backed by it, for two checkouts side by side.
Results: BENCHMARKS.md ("``haepo report`` at 10,000 runs").

    python bench/report_scale.py --runs 10000 --lean --base main     # main's code (before) vs this one
    python bench/report_scale.py --runs 10000 --reuse --code /tmp/report-base .   # store built before
    python bench/report_scale.py --runs 40 --repeats 1 --code .                   # the script itself

The store (``<store-root>/runs-N/mlflow.db``) holds one sweep shaped like a one-iteration HAEPO
bandit sweep's (the paper's K=10 bandit, lr x batch size x beta_ent x beta_kl, seeds), written
through MLflow's client with what the sweep callback writes: a parent run tagged
``haepo.role=sweep``; per trial a child run with its tags (role, parent, trial id and name,
sweep, algorithm, env, seed, search values, node, provenance), its config's params (the sweep
plan's resolved config: 325 of them) and the 58 metric keys an RLlib result gives, at step 1.
Every 100th trial failed (its error tagged): the report lists it apart.

Each measurement is one fresh ``python -m haepo_ray.cli report`` process with the
``haepo_ray`` of one ``--code`` folder (a checkout, e.g. ``git worktree add /tmp/report-base
main``) first on PYTHONPATH; the folders take turns (their order reversed every repeat).
``--base REV`` times a git revision's code too (the *before*: e.g. ``main``), first: a detached
``git worktree`` of it, made for the run and removed after it, so that before and after are
measured in one run on one store without the old code kept in the library.
Wall seconds, CPU seconds (user + system) and peak RSS come from ``wait4`` on the process; over
HTTP the server's CPU seconds (its process tree, from psutil) are added apart. Each row holds the
load average before and after it. Every folder's outputs (results.csv, results.md,
provenance.csv, unfinished.csv) must be byte-identical to the first folder's, else the script
fails. JSON results go to ``--out`` (default .haepo/bench/report_scale-N.json).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from revisions import revision, this_commit  # noqa: E402

EXPERIMENT = "report-scale"
OUTPUTS = ("results.csv", "results.md", "provenance.csv", "unfinished.csv")
ARM_MEANS = [0.956, 0.2077, 0.8284, 0.1493, 0.5128, 0.1359, 0.689, 0.8417, 0.4255, 0.9569]
GRID = {  # 1000 configurations; seeds as many as the runs need
    "lr": [1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 1e-1],
    "batch_size": [8, 16, 32, 64],
    "beta_ent": [0.0, 0.01, 0.02, 0.05, 0.1],
    "beta_kl": [0.0, 0.01, 0.02, 0.05, 0.1],
}
FAILED_EVERY = 100
# The metric keys of a one-iteration HAEPO bandit trial (tune_configs/paper/bandit_k10_haepo.yaml
# cut to one iteration, RLlib 2.60): the default metrics (tracking.schema.DEFAULT_METRICS) of its result.
METRIC_KEYS = (
    "env_runners/episode_len_mean", "env_runners/episode_return_max", "env_runners/episode_return_mean",
    "env_runners/episode_return_min", "env_runners/num_env_steps_sampled_lifetime",
    "env_runners/num_episodes_lifetime", "env_runners/regret_per_step_mean",
    *(f"learners/__all_modules__/{k}" for k in (
        "learner_connector/connector_pipeline_timer",
        *(f"learner_connector/timers/connectors/{c}" for c in (
            "add_columns_from_episodes_to_train_batch", "add_episode_index_and_return",
            "add_observations_from_episodes_to_batch", "add_states_from_episodes_to_batch",
            "add_time_dim_to_batch_and_zero_pad", "batch_individual_items", "numpy_to_tensor")),
        "learner_connector_sum_episodes_length_in", "learner_connector_sum_episodes_length_out",
        "num_env_steps_trained", "num_env_steps_trained_lifetime",
        "num_env_steps_trained_lifetime_throughput/throughput_since_last_reduce",
        "num_env_steps_trained_lifetime_throughput/throughput_since_last_restore",
        "num_env_steps_trained_throughput", "num_module_steps_trained", "num_module_steps_trained_lifetime",
        "num_module_steps_trained_lifetime_throughput/throughput_since_last_reduce",
        "num_module_steps_trained_lifetime_throughput/throughput_since_last_restore",
        "num_module_steps_trained_throughput", "num_non_trainable_parameters", "num_trainable_parameters")),
    *(f"learners/default_policy/{k}" for k in (
        "behavior_logp_gap", "beta_ent", "beta_kl", "default_optimizer_learning_rate",
        "diff_num_grad_updates_vs_sampler_policy", "effective_num_trajectories", "entropy_loss",
        "gradients_default_optimizer_global_norm", "kl_loss", "kl_to_reference", "listwise_size", "max_weight",
        "module_train_batch_size_mean", "num_episodes", "num_module_steps_trained",
        "num_module_steps_trained_lifetime",
        "num_module_steps_trained_lifetime_throughput/throughput_since_last_reduce",
        "num_module_steps_trained_lifetime_throughput/throughput_since_last_restore",
        "num_trainable_parameters", "policy_entropy", "reward_loss", "total_loss", "traj_logp_mean",
        "weight_entropy", "weights_seq_no")),
    "num_env_steps_sampled_lifetime", "time_this_iter_s", "time_total_s", "training_iteration",
)


def load() -> str:
    """``uptime``'s line: the time and the load averages over 1, 5 and 15 minutes."""
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def spec(runs: int) -> dict:
    """The sweep's spec: the bandit grid of :data:`GRID`, as many seeds as ``runs`` needs."""
    configs = int(np.prod([len(v) for v in GRID.values()]))
    return {
        "name": EXPERIMENT, "algorithm": "HAEPO", "env": "haepo/GaussianBandit-v0",
        "env_config": {"num_arms": len(ARM_MEANS), "arm_means": ARM_MEANS},
        "settings": {"num_env_runners": 0, "gamma": 1.0, "num_envs_per_env_runner": 8,
                     "min_sample_timesteps_per_iteration": 250, "min_time_s_per_iteration": 0,
                     "reward_normalization": "zscore", "model_config": {"fcnet_hiddens": [16]}},
        "search_space": {**{k: {"grid": v} for k, v in GRID.items()},
                         "seed": {"grid": list(range(-(-runs // configs)))}},
        "metric": "env_runners/episode_return_mean", "mode": "max", "stop": {"iterations": 1},
        "resources": {"cpus": 1},
    }


def metric_values(values: dict, rng: np.random.Generator) -> dict[str, float]:
    """One iteration's metrics: the return grows with lr and batch size, plus seed noise."""
    out = {key: float(rng.uniform(0, 300)) for key in METRIC_KEYS}
    ret = 0.5 + 0.04 * np.log10(values["lr"] / 1e-4) + 0.01 * np.log2(values["batch_size"]) + rng.normal(0, 0.02)
    out.update({"env_runners/episode_return_mean": float(ret), "env_runners/regret_per_step_mean": 0.9569 - ret,
                "learners/default_policy/policy_entropy": float(rng.uniform(1.5, 2.3)),
                "training_iteration": 1.0, "time_total_s": float(rng.uniform(0.5, 1.0)),
                "env_runners/num_env_steps_sampled_lifetime": 256.0})
    return out


def build_store(db: Path, runs: int, lean: bool = False) -> str:
    """A SQLite store at ``db`` holding the sweep of :func:`spec` with ``runs`` trials; ``lean``:
    of a trial's params only the search values, ``env`` and ``env_config/*`` (what the report
    reads). Written in /dev/shm where there is one (no fsync per commit), then moved to ``db``."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    from haepo_ray import names
    from haepo_ray.provenance import provenance
    from haepo_ray.sweep.kinds import parse_plan
    from haepo_ray.tracking.schema import SWEEP_ROLE, TRIAL_ROLE, params_of, result_tags

    db.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir="/dev/shm" if Path("/dev/shm").is_dir() else None)) / db.name
    uri = f"sqlite:///{scratch}"
    plan = parse_plan(spec(runs), "report-scale.yaml")
    client = MlflowClient(uri)
    exp = client.create_experiment(EXPERIMENT, artifact_location=(db.parent / "mlartifacts").as_uri())
    sweep = f"{EXPERIMENT}-20261125-000000"
    common = {names.ALGORITHM: "HAEPO", names.ENV: "haepo/GaussianBandit-v0"}
    parent = client.create_run(exp, run_name=sweep, tags={
        names.ROLE: SWEEP_ROLE, names.SWEEP: sweep, **provenance(), **common}).info.run_id
    node = result_tags({"node_ip": "192.0.2.2", "hostname": "vm", names.PROVENANCE: provenance()})
    rng = np.random.default_rng(0)
    kept = set(plan.search_keys.values()) | {"env"}
    axes = {**GRID, "seed": plan.spec.search_space["seed"].values}
    started = time.monotonic()
    for i, combo in enumerate(itertools.islice(itertools.product(*axes.values()), runs)):
        values = dict(zip(axes, combo))
        config = {**plan.param_space, **{plan.search_keys[k]: v for k, v in values.items()}}
        trial_id, trial_name = f"00000_{i:05d}", f"HAEPO_haepo_GaussianBandit-v0_00000_{i:05d}"
        run = client.create_run(exp, run_name=trial_name, tags={
            names.PARENT_RUN: parent, names.ROLE: TRIAL_ROLE, names.TRIAL_ID: trial_id,
            names.TRIAL_NAME: trial_name, names.SWEEP: sweep, **common, names.SEED: str(values["seed"]),
            names.SEARCH_VALUES: json.dumps(plan.search_values(config), default=str, sort_keys=True)}).info.run_id
        params = [Param(k, v) for k, v in params_of(config).items()
                  if not lean or k in kept or k.startswith("env_config/")]
        metrics = [Metric(k, v, 1_795_000_000_000 + i, 1) for k, v in metric_values(values, rng).items()]
        client.log_batch(run, metrics=metrics, params=params[:100],
                         tags=[RunTag(k, v) for k, v in {**node, names.NUM_FAILURES: "0"}.items()])
        for start in range(100, len(params), 100):
            client.log_batch(run, params=params[start:start + 100])
        failed = i % FAILED_EVERY == FAILED_EVERY - 1
        if failed:
            client.set_tag(run, names.ERROR, "Traceback (most recent call last):\n  ...\nRuntimeError: injected\n")
        client.set_terminated(run, "FAILED" if failed else "FINISHED")
        if (i + 1) % 500 == 0:
            print(f"{i + 1} runs in {time.monotonic() - started:.0f} s", flush=True)
    client.set_terminated(parent, "FINISHED")
    shutil.move(scratch, db)
    shutil.rmtree(scratch.parent)
    return f"sqlite:///{db}"


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and its descendants so far."""
    import psutil

    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    return sum(sum(p.cpu_times()[:2]) for p in procs)


def time_report(code: Path, uri: str, out: Path, server_pid: int | None = None) -> dict:
    """One ``haepo report`` of the sweep with ``code``'s haepo_ray: its wall and CPU seconds, peak
    RSS and the load average around it (and the server's CPU seconds over HTTP)."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["PYTHONPATH"] = str(code)
    out.mkdir(parents=True, exist_ok=True)  # the working directory: python -m puts it first on sys.path
    where = subprocess.run([sys.executable, "-c", "import haepo_ray; print(haepo_ray.__file__)"], cwd=out,
                           env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(code.resolve()), f"{code}: imports haepo_ray from {where}"
    before, server_before = load(), tree_cpu_s(server_pid) if server_pid else 0.0
    started = time.perf_counter()
    with open(out / "report.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "haepo_ray.cli", "report", "--tracking-uri", uri,
                                 "--experiment", EXPERIMENT, "--out", str(out)],
                                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=out)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"haepo report failed ({code}):\n" + (out / "report.log").read_text()[-3000:])
    row = {"code": str(code), "wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
           "peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "load_before": before, "load_after": load()}
    if server_pid:
        row["server_cpu_s"] = round(tree_cpu_s(server_pid) - server_before, 2)
    return row


def same_outputs(first: Path, other: Path) -> list[str]:
    """The report files that differ between two outputs folders."""
    return [name for name in OUTPUTS
            if (first / name).exists() != (other / name).exists()
            or (first / name).exists() and (first / name).read_bytes() != (other / name).read_bytes()]


def measure(codes: list[Path], uri: str, work: Path, repeats: int, server_pid: int | None = None) -> list[dict]:
    """``repeats`` rounds of one report per code folder, their order reversed every round."""
    rows = []
    for r in range(repeats):
        for c, code in (list(enumerate(codes)) if r % 2 == 0 else list(enumerate(codes))[::-1]):
            row = time_report(code, uri, work / f"r{r}-c{c}", server_pid)
            differ = same_outputs(work / f"r{r}-c0", work / f"r{r}-c{c}") if (work / f"r{r}-c0").exists() else []
            if differ:
                raise RuntimeError(f"{code}'s report differs from {codes[0]}'s in {differ} ({work})")
            print(json.dumps(row), flush=True)
            rows.append({"repeat": r, **row})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10_000, help="child runs of the sweep (default 10000)")
    parser.add_argument("--code", type=Path, nargs="+", default=[REPO], help="checkouts to compare")
    parser.add_argument("--base", metavar="REV", help="time this git revision's code first (a worktree of it)")
    parser.add_argument("--repeats", type=int, default=2, help="rounds over the checkouts (default 2)")
    parser.add_argument("--store-root", type=Path, default=REPO / ".haepo" / "bench" / "report_scale")
    parser.add_argument("--reuse", action="store_true", help="use the store built by an earlier run")
    parser.add_argument("--lean", action="store_true",
                        help="trials with only the params the report reads (a build 4x faster; see build_store)")
    parser.add_argument("--backends", nargs="+", choices=("sqlite", "server"), default=["sqlite", "server"])
    parser.add_argument("--out", type=Path, help="JSON results (default .haepo/bench/report_scale-N.json)")
    args = parser.parse_args(argv)
    root = args.store_root / f"runs-{args.runs}{'-lean' if args.lean else ''}"
    db = root / "mlflow.db"
    if args.reuse and db.is_file():
        uri = f"sqlite:///{db}"
    else:
        if db.exists():
            raise SystemExit(f"{db} exists: --reuse it, or remove it to build a new one")
        started = time.monotonic()
        uri = build_store(db, args.runs, args.lean)
        print(f"built {args.runs} runs in {time.monotonic() - started:.0f} s ({load()})", flush=True)
    codes = [c.resolve() for c in args.code]
    commits = {str(REPO): this_commit()}
    if not args.base:
        return run(args, uri, root, codes, commits)
    with revision(args.base) as (base, commit):
        commits[str(base)] = commit
        return run(args, uri, root, [base, *codes], commits)


def run(args: argparse.Namespace, uri: str, root: Path, codes: list[Path], commits: dict[str, str]) -> int:
    """Measures ``codes`` on the store at ``uri`` and writes the results."""
    result = {"runs": args.runs, "lean": args.lean, "store": uri, "codes": [str(c) for c in codes],
              "commits": commits, "machine": platform.node(), "cpus": os.cpu_count(),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "measurements": {}}
    if "sqlite" in args.backends:
        result["measurements"]["sqlite"] = measure(codes, uri, root / "out-sqlite", args.repeats)
    if "server" in args.backends:
        sys.path.insert(0, str(REPO / "tests"))
        from helpers import MLflowServer

        (root / "server").mkdir(exist_ok=True)
        server = MLflowServer(root / "server", backend=uri)
        try:
            result["measurements"]["server"] = measure(codes, server.uri, root / "out-server", args.repeats,
                                                       server.proc.pid)
        finally:
            server.kill()
    out = args.out or REPO / ".haepo" / "bench" / f"report_scale-{args.runs}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
