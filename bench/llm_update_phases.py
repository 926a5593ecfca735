"""Where a language-model update's time goes on this CPU, each phase against its roofline.

One run per algorithm (:class:`haepo_ray.llm.train.LLMRun`: SFT, then ``--updates`` RL updates
and the held-out evaluation after the last) with the settings of
``tune_configs/llm_cpu_ranked.yaml`` (``--set name=value`` changes one), on ``--threads`` torch
threads. Per update, from the run's cumulative ``phase_time_s`` (the first update left out: it
pays for lazy initialisation), against the roofline: the FLOPs the memory simulator counts for
the same step (:func:`haepo_ray.llm.capacity.estimate.estimate`, ``target="cpu"``, prompts of
the run's mean prompt length) at this machine's float32 matrix-multiply rate on those threads
(the best of 5 products of 1024 x 1024 matrices, measured first):

- ``rollout``: sampling (roofline: the generation phase's FLOPs) and the rewards (the
  sentence encoder's pass: outside the roofline);
- ``update``: the reference pass, forward and backward, the optimiser step;
- ``metrics``: the row's metrics (no roofline);
- ``eval``: the held-out evaluation once, its greedy and sampled completions of
  ``eval_prompts`` prompts (no roofline: reported as measured; with ``eval_start`` the run
  evaluates twice, the SFT start and after the last update, and this is their mean).

Each run's wall and CPU seconds come with it. Then the spec's sweep, estimated from these
figures: each trial's model loading, ``rl_updates`` updates and its evaluations (every
``eval_every`` and the last) at its algorithm's measured times (a method with settings of its
own at its algorithm's), plus one SFT per seed (the trials of a seed share it) and, with
``eval_start``, one evaluation of it, divided by the
trials run at once (``max_concurrent_trials``).

    .venv/bin/python bench/llm_update_phases.py OUT.json [--algo HAEPO GRPO DPO] [--updates 4]
                                                [--threads 1] [--set lora_r=0 ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

from haepo_ray.llm.capacity.estimate import estimate
from haepo_ray.llm.data import format_prompt
from haepo_ray.llm.settings import ALGORITHMS, LLMTrainSettings
from haepo_ray.llm.train import LLMRun
from haepo_ray.sweep.kinds import load_plan
from haepo_ray.sweep.planned import planned_trials

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "tune_configs" / "llm_cpu_ranked.yaml"
ROOFLINE = {"rollout": ("generation",), "update": ("reference", "forward_backward", "optimizer")}


def matmul_gflops(threads: int, n: int = 1024, repeats: int = 5) -> float:
    """float32 n x n matrix products per second on ``threads`` torch threads, in GFLOP/s (best)."""
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def spec_settings(plan, algo: str, changes: dict[str, str]) -> LLMTrainSettings:
    """The ranked spec's settings for ``algo`` at seed 0, as its trials get them (its plan),
    with ``changes`` (settings' names, values parsed as YAML)."""
    settings = plan.trial_config({"algorithm": algo, "seed": 0})
    return dataclasses.replace(settings, **{k: yaml.safe_load(v) for k, v in changes.items()})


def measure(settings: LLMTrainSettings, gflops: float) -> dict:
    wall, cpu = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory() as out:
        run = LLMRun(settings, out)
        try:
            run.sft()
            rows = list(run.rl())
        finally:
            run.close()
        tokenizer, rl = run.tokenizer, run.splits.rl
        lengths = [len(tokenizer(format_prompt(e, tokenizer, settings.max_source_words))["input_ids"])
                   for e in rl[:settings.batch_prompts * settings.rl_updates]]
    prompt_tokens = round(sum(lengths) / len(lengths))
    steady = rows[1:]
    phases = ("rollout", "update", "metrics")
    per_update = {p: (steady[-1]["phase_time_s"][p] - rows[0]["phase_time_s"][p]) / len(steady) for p in phases}
    est = estimate(settings, prompt_tokens=prompt_tokens, target="cpu")
    roofline = {p: sum(est.phases[q].flops for q in parts) / (gflops * 1e9) for p, parts in ROOFLINE.items()}
    last = rows[-1]["phase_time_s"]
    return {"algo": settings.algo, "prompt_tokens": prompt_tokens, "per_update_s": per_update,
            "roofline_s": roofline, "ratio": {p: per_update[p] / roofline[p] for p in roofline},
            "update_s": sum(per_update.values()), "update_roofline_s": sum(roofline.values()),
            "eval_s": last["eval"] / (1 + settings.eval_start), "sft_s": last["sft"], "load_s": last["load"],
            "wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
            "tflop_per_update": sum(est.phases[q].flops for parts in ROOFLINE.values() for q in parts) / 1e12}


def sweep_estimate(plan, rows: list[dict]) -> dict:
    """The ranked spec's wall time from the measured ``rows`` (module docstring), in seconds."""
    measured = {r["algo"]: r for r in rows}
    trials = [plan.trial_config(t.values) for t in planned_trials(plan)]
    missing = sorted({t.algo for t in trials} - set(measured))
    if missing:
        return {"missing": missing}
    total = 0.0
    for t in trials:
        r = measured[t.algo]
        evaluations = sum(t.evaluated_after(u) for u in range(1, t.rl_updates + 1))
        total += r["load_s"] + t.rl_updates * r["update_s"] + evaluations * r["eval_s"]
    starts = len({t.seed for t in trials})  # with eval_start, each start is evaluated once, by its maker
    start_eval = any(t.eval_start for t in trials) * max(r["eval_s"] for r in rows)
    total += starts * (max(r["sft_s"] for r in rows) + start_eval)
    at_once = plan.spec.max_concurrent_trials
    return {"trials": len(trials), "at_once": at_once, "seconds": total / at_once}


def table(result: dict) -> str:
    lines = [f"float32 matmul: {result['gflops']:.0f} GFLOP/s on {result['threads']} thread(s); "
             f"{result['updates']} updates (the first left out)", "",
             "| algo | prompt tokens | TFLOP/update | rollout s (roofline, x) | update s (roofline, x) | metrics s "
             "| update total s (x roofline) | eval s | SFT s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        cells = [r["algo"], str(r["prompt_tokens"]), f"{r['tflop_per_update']:.2f}",
                 *(f"{r['per_update_s'][p]:.1f} ({r['roofline_s'][p]:.1f}, {r['ratio'][p]:.1f}x)"
                   for p in ("rollout", "update")),
                 f"{r['per_update_s']['metrics']:.1f}",
                 f"{r['update_s']:.1f} ({r['update_s'] / r['update_roofline_s']:.1f}x)", f"{r['eval_s']:.0f}",
                 f"{r['sft_s']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"{r['algo']}: {r['wall_s']:.0f} s wall, {r['cpu_s']:.0f} CPU-s" for r in result["rows"]]
    sweep = result["sweep"]
    lines.append(f"{SPEC.name}, estimated: missing {', '.join(sweep['missing'])}" if "missing" in sweep else
                 f"{SPEC.name}, estimated: {sweep['seconds'] / 3600:.2f} h ({sweep['trials']} trials, "
                 f"{sweep['at_once']} at once)")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--algo", nargs="+", choices=ALGORITHMS, default=["HAEPO"])
    parser.add_argument("--updates", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE")
    args = parser.parse_args(argv)
    gflops = matmul_gflops(args.threads)
    changes = dict(item.split("=", 1) for item in args.set)
    plan = load_plan(SPEC)
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    result = {"commit": commit, "threads": args.threads, "gflops": gflops, "updates": args.updates,
              "changes": changes, "rows": []}
    for algo in args.algo:
        settings = dataclasses.replace(spec_settings(plan, algo, changes), rl_updates=args.updates, eval_every=0)
        result["settings"] = dataclasses.asdict(settings) | {"algo": None}
        result["rows"].append(measure(settings, gflops))
        result["sweep"] = sweep_estimate(plan, result["rows"])
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result["rows"][-1]), flush=True)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
