"""The resident memory of a reused trial process, trial after trial: one real ``haepo sweep``
(embedded Ray, MLflow on SQLite) whose trials run one at a time, every trial in the process the
first one started (``reuse_actors``), for two checkouts in one run: SmolLM2-135M trials that
each train in their trial's own process (``num_workers: 0``), or (``--kind rl``) HAEPO trials
on CartPole. Results: BENCHMARKS.md ("A reused trial process").

    python bench/reused_trial_rss.py --base ae854fc        # that revision (before) and this checkout
    python bench/reused_trial_rss.py --trials 2            # this checkout only, quickly
    python bench/reused_trial_rss.py --kind rl --trials 100 --every 0.1 --base 4dd43b0

The trial process (a ``ray::`` process under the sweep's, the one holding the most memory) is
sampled every ``--every`` seconds with psutil; each trial's row comes from its MLflow run's start
and end: the process's resident memory when the trial starts (what the trials before it left)
and its peak while it runs. The
trials are the spec of :func:`spec`: LoRA r 8, 16 SFT examples, 4 RL updates of 2 prompts x 4
completions of up to 32 tokens, the three algorithms in turn, so every trial does the same work;
or :func:`rl_spec`'s, 5 iterations of 8 episodes each, one seed per trial. JSON results go to
``--out`` (default .haepo/bench/reused_trial_rss[_rl].json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from revisions import revision, this_commit  # noqa: E402

from haepo_ray import names  # noqa: E402
from haepo_ray.provenance import machine  # noqa: E402

EXPERIMENT = "reused-trial-rss"


def spec(trials: int) -> dict:
    """``trials`` equal SmolLM2 trials, one at a time in one reused process."""
    return {
        "name": EXPERIMENT,
        "description": "a reused LM trial process's memory, trial after trial",
        "llm": {"model": "smollm2", "data": "aclsum", "num_workers": 0, "cpus_per_worker": 1.75},
        "search_space": {"algorithm": {"grid": [("HAEPO", "GRPO", "DPO")[i % 3] for i in range(trials)]}},
        "settings": {"seed": 0, "sft_examples": 16, "sft_batch": 4, "rl_updates": 4, "batch_size": 2,
                     "group_size": 4, "max_new_tokens": 32, "max_source_words": 64, "micro_batch_size": 0,
                     "lora_r": 8, "eval_prompts": 4},
        "metric": "reward_mean", "mode": "max",
        "resources": {"cpus": 0.25},
        "max_concurrent_trials": 1,
        "reuse_actors": True,
        "max_failures": 0,
        "checkpoint_frequency": 0,
        "ray": {"num_cpus": 2},
    }


def rl_spec(trials: int) -> dict:
    """``trials`` equal HAEPO CartPole trials (seeds 0..trials-1), one at a time in one reused process."""
    return {
        "name": EXPERIMENT,
        "description": "a reused RL trial process's memory, trial after trial",
        "algorithm": "HAEPO", "env": "CartPole-v1",
        "settings": {"num_env_runners": 0, "batch_size": 8, "beta_ent": 0.05, "beta_kl": 0.05},
        "search_space": {"seed": {"grid": list(range(trials))}},
        "metric": "env_runners/episode_return_mean", "mode": "max",
        "stop": {"iterations": 5},
        "resources": {"cpus": 1, "gpus": 0},
        "max_concurrent_trials": 1,
        "reuse_actors": True,
        "max_failures": 0,
        "checkpoint_frequency": 0,
        "ray": {"num_cpus": 2},
    }


SPECS = {"llm": spec, "rl": rl_spec}


def sample(root: int, samples: list[tuple[float, int, float]], stop: threading.Event, every: float) -> None:
    """Appends (time, pid, RSS in MB) of every ``ray::`` process under ``root`` until ``stop``."""
    parent = psutil.Process(root)
    while not stop.wait(every):
        now = time.time()
        for proc in parent.children(recursive=True):
            try:
                if proc.cmdline()[:1] and proc.cmdline()[0].startswith("ray::"):
                    samples.append((now, proc.pid, proc.memory_info().rss / 2**20))
            except psutil.Error:
                continue


def trial_rows(uri: str, series: list[tuple[float, float]], near: float = 3.0) -> list[dict]:
    """Per trial (in start order): the trial process's RSS when the trial starts (the least within
    ``near`` seconds of its MLflow run's start: the driver records it, not the process) and its
    peak while the trial runs."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id], f"tags.`{names.ROLE}` = 'trial'", order_by=["start_time"])
    rows = []
    for i, run in enumerate(runs):
        start, end = run.info.start_time / 1000, run.info.end_time / 1000
        at_start = [rss for t, rss in series if abs(t - start) <= near]
        during = [rss for t, rss in series if start <= t <= end]
        rows.append({"trial": i + 1, "algorithm": run.data.tags.get(names.ALGORITHM),
                     "start_rss_mb": round(min(at_start)) if at_start else None,
                     "peak_rss_mb": round(max(during)) if during else None, "seconds": round(end - start, 1)})
    return rows


def trial_process(samples: list[tuple[float, int, float]]) -> tuple[int, list[tuple[float, float]]]:
    """The trial process (the ``ray::`` process that held the most memory: the model's) and its
    (time, RSS) samples."""
    peak_of: dict[int, float] = {}
    for _, pid, rss in samples:
        peak_of[pid] = max(peak_of.get(pid, 0.0), rss)
    pid = max(peak_of, key=peak_of.get)
    return pid, [(t, rss) for t, p, rss in samples if p == pid]


def measure(code: Path, kind: str, trials: int, work: Path, every: float) -> dict:
    """One sweep of ``kind`` with ``code``'s ``haepo_ray``; its trials' rows."""
    work.mkdir(parents=True)
    (work / "spec.yaml").write_text(yaml.safe_dump(SPECS[kind](trials), sort_keys=False))
    uri = f"sqlite:///{work / 'mlflow.db'}"
    env = {**os.environ, "PYTHONPATH": str(code)}
    samples: list[tuple[float, int, float]] = []
    stop = threading.Event()
    started = time.time()
    with open(work / "sweep.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "haepo_ray.cli", "sweep", str(work / "spec.yaml"),
                                 "--storage-path", str(work / "ray"), "--tracking-uri", uri, "--quiet"],
                                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work)
        sampler = threading.Thread(target=sample, args=(proc.pid, samples, stop, every), daemon=True)
        sampler.start()
        code_rc = proc.wait()
        stop.set()
        sampler.join()
    if code_rc != 0:
        raise RuntimeError(f"the sweep with {code} failed:\n" + (work / "sweep.log").read_text()[-3000:])
    pid, series = trial_process(samples)
    return {"code": str(code), "wall_s": round(time.time() - started, 1), "pid": pid,
            "trials": trial_rows(uri, series), "samples": [(round(t - started, 1), round(rss)) for t, rss in series]}


def table(results: list[dict], commits: dict[str, str]) -> str:
    """Markdown: a row per trial (past 12 trials: the 1st, 2nd, 10th, 25th, 50th, ... and the
    last), the start and peak RSS of each checkout side by side."""
    names = [commits[r["code"]][:7] for r in results]
    head = "| trial | algorithm | " + " | ".join(f"{n}: at start / peak (MB)" for n in names) + " |"
    lines = [head, "|" + "---|" * (2 + len(results))]
    count = len(results[0]["trials"])
    shown = set(range(count)) if count <= 12 else {0, 1, 9, count - 1} | set(range(24, count, 25))
    for i, row in enumerate(results[0]["trials"]):
        if i not in shown:
            continue
        cells = [" / ".join(f"{r['trials'][i][key]:,}" if r["trials"][i][key] is not None else "-"
                            for key in ("start_rss_mb", "peak_rss_mb")) for r in results]
        lines.append(f"| {row['trial']} | {row['algorithm']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", choices=sorted(SPECS), default="llm", help="SmolLM2 trials, or HAEPO on CartPole")
    parser.add_argument("--trials", type=int, default=6, help="trials in the sweep (default 6)")
    parser.add_argument("--base", metavar="REV", help="measure this git revision's code first (a worktree of it)")
    parser.add_argument("--every", type=float, default=0.5, help="seconds between samples (default 0.5)")
    parser.add_argument("--out", type=Path, help="default .haepo/bench/reused_trial_rss.json (_rl.json: --kind rl)")
    args = parser.parse_args(argv)
    out = args.out or REPO / ".haepo" / "bench" / f"reused_trial_rss{'_rl' if args.kind == 'rl' else ''}.json"
    commits = {str(REPO): this_commit()}
    with tempfile.TemporaryDirectory(prefix="reused-trial-rss-") as tmp:
        results = []
        if args.base:
            with revision(args.base) as (base, commit):
                commits[str(base)] = commit
                results.append(measure(base, args.kind, args.trials, Path(tmp) / "base", args.every))
        results.append(measure(REPO, args.kind, args.trials, Path(tmp) / "this", args.every))
    report = {"kind": args.kind, "commits": commits, "machine": machine(),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "load_after": os.getloadavg(),
              "results": results, "table": table(results, commits)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(report["table"])
    print(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
