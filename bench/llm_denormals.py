"""Do subnormal floats make HAEPO's language-model update slower than GRPO's?

Three runs with the settings of ``tune_configs/llm_cpu_ranked.yaml`` at seed 0 (SmolLM2-135M-Instruct,
LoRA r 8, float32, 2 prompts x 4 completions of 16 tokens; ``--set name=value`` changes one):
HAEPO, HAEPO with ``length_normalize``, GRPO, all from one SFT start (made once, loaded by the
others). Their RL updates are interleaved: update i of every run in turn, then update i + 1, and
within each run the updates alternate between ``flush_denormal`` false and true (the runs offset
by one, A B A B ...; :func:`haepo_ray.llm.policy.denormals`), so drift in the machine's load hits
every method and both conditions alike. ``--updates`` per run, of which the first ``--warmup`` are left out: the rest
split evenly between the two conditions.

Per update: wall and CPU seconds of :meth:`haepo_ray.llm.policy.Policy.rl_update` (the reference
pass, forward and backward, the optimiser step), the rollout's wall seconds, HAEPO's effective
number of trajectories, and the 1-minute load average.

Then ``--count`` more updates per run, flushing off, count the subnormal values (non-zero, of
magnitude below ``torch.finfo(dtype).tiny``) in the gradient of every module's output (the LM
head's output: the logits) and of every trainable parameter: where the backward pass meets them;
per update, with its CPU seconds (the hooks' own cost included) and effective number of trajectories.

    .venv/bin/python bench/llm_denormals.py OUT.json [--updates 42] [--warmup 2] [--count 2] [--threads 1]
                                            [--methods HAEPO GRPO ...]
    .venv/bin/python bench/llm_denormals.py --gemm [--threads 1]

``--gemm`` times the LM head's backward product alone: the gradient of SmolLM2's logits of one
update (8 rows x 17 positions x 49,152) times its 49,152 x 576 weight, with the gradient's values
normal (1e-30 times uniform) and subnormal (1e-40 times uniform), without and with flushing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from haepo_ray.llm.settings import LLMTrainSettings
from haepo_ray.llm.train import LLMRun
from haepo_ray.sweep.kinds import load_plan

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "tune_configs" / "llm_cpu_ranked.yaml"
METHODS: dict[str, dict[str, Any]] = {
    "HAEPO": {"algo": "HAEPO"},
    "HAEPO (length_normalize=True)": {"algo": "HAEPO", "length_normalize": True},
    "GRPO": {"algo": "GRPO"},
}


class Timed:
    """``fn`` with the wall and CPU seconds of each call recorded."""

    def __init__(self, fn) -> None:
        self.fn, self.wall, self.cpu = fn, [], []

    def __call__(self, *args, **kwargs):
        wall, cpu = time.perf_counter(), time.process_time()
        out = self.fn(*args, **kwargs)
        self.wall.append(time.perf_counter() - wall)
        self.cpu.append(time.process_time() - cpu)
        return out


class SubnormalCounter:
    """Counts subnormal values in the gradients of ``model``'s module outputs while installed."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.counts: dict[str, list[int]] = {}  # name -> [subnormal, non-zero, values]
        self.handles = [m.register_forward_hook(self._forward(name)) for name, m in model.named_modules() if name]
        self.handles += [p.register_hook(lambda g, name=name: self.add(f"param:{name}", g))
                         for name, p in model.named_parameters() if p.requires_grad]

    def _forward(self, name: str):
        def hook(module, args, output):
            out = output[0] if isinstance(output, tuple) else getattr(output, "logits", output)
            if isinstance(out, torch.Tensor) and out.requires_grad and out.is_floating_point():
                out.register_hook(lambda g: self.add(name, g))
        return hook

    def add(self, name: str, g: torch.Tensor) -> None:
        tiny = torch.finfo(g.dtype).tiny
        nonzero = g != 0
        row = self.counts.setdefault(name, [0, 0, 0])
        row[0] += int((nonzero & (g.abs() < tiny)).sum())
        row[1] += int(nonzero.sum())
        row[2] += g.numel()

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def gemm(threads: int) -> None:
    """CPU seconds of the LM head's backward product on normal and subnormal input (module docstring)."""
    torch.set_num_threads(threads)
    weight, grad = torch.randn(49152, 576) * 0.02, torch.rand(136, 49152)
    for scale in (1e-30, 1e-40):
        g = grad * scale  # made while subnormals are kept: the product's input holds them
        subnormal = int(((g != 0) & (g.abs() < torch.finfo(g.dtype).tiny)).sum())
        for flush in (False, True):
            torch.set_flush_denormal(flush)  # flushing reads subnormal input as 0 (DAZ)
            start = time.process_time()
            g @ weight
            torch.set_flush_denormal(False)
            print(f"scale {scale:g} ({subnormal:,} of {g.numel():,} subnormal), flush {flush}: "
                  f"{time.process_time() - start:.3f} CPU-s", flush=True)


def settings_of(plan, method: dict[str, Any], changes: dict[str, str]) -> LLMTrainSettings:
    base = plan.trial_config({"algorithm": method["algo"], "seed": 0})
    extra = {k: v for k, v in method.items() if k != "algo"}
    return dataclasses.replace(base, **extra, **{k: yaml.safe_load(v) for k, v in changes.items()},
                               rl_updates=10**6, eval_every=0)


def subnormal_totals(counts: dict[str, list[int]]) -> list[list[int]]:
    """[subnormal, non-zero, values] of the LM head's output, of all module outputs, of the parameters."""
    def total(keep) -> list[int]:
        return [sum(v[i] for k, v in counts.items() if keep(k)) for i in range(3)]
    return [total(lambda k: k.endswith("lm_head")), total(lambda k: not k.startswith("param:")),
            total(lambda k: k.startswith("param:"))]


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0, "median": math.nan, "mean": math.nan, "max": math.nan}
    return {"n": len(values), "median": statistics.median(values), "mean": statistics.fmean(values),
            "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, nargs="?")
    parser.add_argument("--gemm", action="store_true")
    parser.add_argument("--updates", type=int, default=42)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--count", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    parser.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE")
    args = parser.parse_args(argv)
    if args.gemm:
        gemm(args.threads)
        return 0
    if args.out is None:
        parser.error("OUT is required without --gemm")
    torch.set_num_threads(args.threads)
    if not torch.set_flush_denormal(False):
        raise SystemExit("torch.set_flush_denormal is not supported on this CPU")

    def flushing(run: LLMRun, flush: bool) -> None:  # the run's next update with or without flushing
        run.settings = dataclasses.replace(run.settings, flush_denormal=flush)
    changes = dict(item.split("=", 1) for item in args.set)
    plan = load_plan(SPEC)
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in subprocess.run(
        ["lscpu"], capture_output=True, text=True).stdout.splitlines() if line.startswith("Model name")), "")
    result: dict[str, Any] = {"commit": commit, "cpu": cpu, "threads": args.threads, "torch": torch.__version__,
                              "updates": args.updates, "warmup": args.warmup, "changes": changes,
                              "load_start": os.getloadavg(), "methods": {}}
    wall0, cpu0 = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        runs: dict[str, LLMRun] = {}
        for i, name in enumerate(args.methods):
            method = METHODS[name]
            run = LLMRun(settings_of(plan, method, changes), Path(tmp) / f"run{i}")
            if i == 0:
                run.sft()
                run.save_sft(Path(tmp) / "sft")
            else:
                run.load_sft(Path(tmp) / "sft")
            run.policy.rl_update = Timed(run.policy.rl_update)
            runs[name] = run
        streams = {name: run.rl() for name, run in runs.items()}
        records: dict[str, list[dict]] = {name: [] for name in runs}
        for u in range(args.updates):
            for j, (name, run) in enumerate(runs.items()):
                flush = (u + j) % 2 == 1
                flushing(run, flush)
                before = dict(run.clock.phases)
                row = next(streams[name])
                timed = run.policy.rl_update
                records[name].append({
                    "update": u + 1, "flush": flush, "update_wall_s": timed.wall[-1], "update_cpu_s": timed.cpu[-1],
                    "rollout_wall_s": run.clock.phases["rollout"] - before["rollout"],
                    "effective_num_trajectories": row["effective_num_trajectories"], "load": os.getloadavg()[0]})
            print(json.dumps({n: r[-1] for n, r in records.items()}), flush=True)
        for name, run in runs.items():
            flushing(run, False)
            counted, counts = [], {}
            for _ in range(args.count):
                counter = SubnormalCounter(run.model)
                try:
                    row = next(streams[name])
                finally:
                    counter.close()
                counted.append({"update_cpu_s": run.policy.rl_update.cpu[-1],
                                "effective_num_trajectories": row["effective_num_trajectories"],
                                **dict(zip(("lm_head_output", "module_outputs", "parameter_grads"),
                                           subnormal_totals(counter.counts)))})
                for k, v in counter.counts.items():
                    counts[k] = [a + b for a, b in zip(counts.get(k, [0, 0, 0]), v)]
            head = {k: v for k, v in counts.items() if k.endswith("lm_head")}
            _, total, params = subnormal_totals(counts)
            steady = records[name][args.warmup:]
            result["methods"][name] = {
                "updates": records[name],
                **{f"{key}_{cond}": summary([r[key] for r in steady if r["flush"] == flag])
                   for key in ("update_wall_s", "update_cpu_s", "rollout_wall_s")
                   for cond, flag in (("plain", False), ("flush", True))},
                "effective_num_trajectories": statistics.fmean([r["effective_num_trajectories"] for r in steady]
                                                              or [math.nan]),
                "subnormal": {"updates": args.count, "lm_head_output": head, "module_outputs": total,
                              "parameter_grads": params, "per_update": counted,
                              "top_modules": sorted(([k, *v] for k, v in counts.items() if v[0]),
                                                    key=lambda r: -r[1])[:8]},
            }
            run.close()
    result.update(wall_s=time.perf_counter() - wall0, cpu_s=time.process_time() - cpu0, load_end=os.getloadavg())
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    return 0


def table(result: dict) -> str:
    lines = [f"{result['cpu']}, {result['threads']} thread(s), commit {result['commit']}; "
             f"load {result['load_start'][0]:.1f} at start, {result['load_end'][0]:.1f} at end; "
             f"{result['wall_s']:.0f} s wall, {result['cpu_s']:.0f} CPU-s", "",
             "| method | update CPU s, plain: median / mean / max | flush | mean flush / plain | update wall s, "
             "plain: median / mean | flush | n_eff | subnormal grads: LM head output | all module outputs | parameter "
             "grads |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in result["methods"].items():
        s = m["subnormal"]
        head = [sum(v[i] for v in s["lm_head_output"].values()) for i in range(3)]
        plain, flush = m["update_cpu_s_plain"], m["update_cpu_s_flush"]
        cells = [name, *(f"{c['median']:.2f} / {c['mean']:.2f} / {c['max']:.1f} (n {c['n']})" for c in (plain, flush)),
                 f"{flush['mean'] / plain['mean']:.2f}",
                 *(f"{m[k]['median']:.1f} / {m[k]['mean']:.1f}" for k in ("update_wall_s_plain",
                                                                          "update_wall_s_flush")),
                 f"{m['effective_num_trajectories']:.2f}",
                 *(f"{c[0]:,} of {c[2]:,}" for c in (head, s["module_outputs"], s["parameter_grads"]))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n(seconds of Policy.rl_update per update; subnormals over the counted updates)\n"


if __name__ == "__main__":
    sys.exit(main())
