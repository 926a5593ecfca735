"""This project's GRPO step against TRL's own, simulated on Qwen2.5-1.5B: peak GPU memory.

Rows, each in bfloat16 and float32 (the paper's TL;DR GRPO: 38 GB on an A100 40GB):

- (a) this project's HAEPO and GRPO at the paper's settings (``tune_configs/paper/tldr_*.yaml``:
  4 prompts x 4 completions, 48 new tokens, micro-batches of 4, prompts of 512, beta_kl 1e-2),
  then :data:`SWITCH_ROWS`: GRPO with the implementation switches of ``LLMTrainSettings`` and
  TRL's default shapes turned one at a time, cumulatively, towards TRL's default step (the
  last of them is (c) at beta 0 run by this project's code);
- (b) TRL's GRPO step (``haepo_ray.llm.capacity.trl_grpo``, the installed TRL) at the same
  settings: ``per_device_train_batch_size`` 4, ``num_generations`` 4, 4 accumulation steps,
  ``max_completion_length`` 48, ``beta`` 0.01, no checkpointing; weights in the row's dtype,
  ``bf16`` autocast with bfloat16 weights only;
- (c) TRL's GRPO at the installed GRPOConfig's defaults (8 completions of a prompt, micro-batch
  8, no accumulation, ``max_completion_length`` 512, checkpointing on, ``bf16`` autocast, loss
  ``dapo``, one iteration), prompts of 512, ``beta`` 0 and 0.04 (TRL then holds a reference
  copy), and beta 0.04 with completions of 256, with and without checkpointing (earlier
  releases' defaults: these had no fused LM head, which is not simulated); the float32 rows
  are TRL's default load dtype (float32 weights, bfloat16 autocast: mixed precision), the
  bfloat16 rows a model loaded in bfloat16.

"step peak" is the most allocated in the training step (old policy, reference, forward and
backward, optimiser): TRL's figure does not cover generation (not simulated for TRL), so (a)'s
generation and SFT phases are shown apart ("all phases"). "reserved" adds the caching
allocator's replayed reserve, cuBLAS's workspaces and the CUDA context (as
``haepo_ray.llm.capacity.estimate`` does): what ``nvidia-smi`` would show.

    .venv/bin/python bench/trl_walk.py --out bench/results/trl_walk.json   # prints the table (markdown)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import torch

from haepo_ray.llm.capacity.estimate import CUBLAS_HANDLES, CUBLAS_WORKSPACE_BYTES, CUDA_CONTEXT_BYTES, estimate
from haepo_ray.llm.capacity.model_configs import model_config
from haepo_ray.llm.capacity.steps import Shapes
from haepo_ray.llm.capacity.trl_grpo import TRL_PHASES, grpo_args, simulate_trl
from haepo_ray.llm.settings import LLMTrainSettings

GIB = 2**30
MODEL = "qwen2.5-1.5b"
PROMPT_TOKENS = 512
DTYPES = ("bfloat16", "float32")
# (label, LLMTrainSettings changes): cumulative, from this project's GRPO towards TRL's step.
# TRL's AdamW is torch's fused one (the HF Trainer's default), which no switch value gives:
# per_parameter is the nearest (neither holds the multi-tensor step's temporaries).
SWITCH_ROWS: list[tuple[str, dict]] = [
    ("+ logits chunked (TRL's fused LM head)", {"logits": "chunked"}),
    ("+ generation batch (one generate call for the batch)", {"generation": "batch"}),
    ("+ precision mixed (float32 weights, bfloat16 passes: TRL's default)",
     {"precision": "mixed", "dtype": "bfloat16"}),
    ("+ TRL's default shapes (1 prompt x 8 completions of 512 tokens, one micro-batch)",
     {"batch_prompts": 1, "group_size": 8, "max_new_tokens": 512, "micro_batch_size": 0}),
    ("+ gradient checkpointing (TRL's default)", {"gradient_checkpointing": True}),
    ("+ no reference (beta 0: TRL's default)", {"reference": "none", "beta_kl": 0.0}),
    ("+ AdamW one parameter at a time (the nearest to TRL's fused AdamW: no multi-tensor temporaries)",
     {"adamw": "per_parameter"}),
]
PAPER = {"batch_prompts": 4, "group_size": 4, "max_new_tokens": 48, "micro_batch_size": 4}
TRL_PAPER = {"per_device_train_batch_size": 4, "num_generations": 4, "gradient_accumulation_steps": 4,
             "max_completion_length": 48, "gradient_checkpointing": False}
# Earlier TRL releases' default max_completion_length (with beta 0.04, num_generations 8 and
# no gradient checkpointing).
EARLIER_COMPLETION = 256
EXTRA = CUBLAS_HANDLES * CUBLAS_WORKSPACE_BYTES + CUDA_CONTEXT_BYTES  # beside the allocator's reserve


def _top(categories: dict[str, int]) -> str:
    return ", ".join(f"{c} {b / GIB:.1f}" for b, c in sorted(((b, c) for c, b in categories.items() if b),
                                                          reverse=True)[:3])


def _ours(label: str, algo: str = "GRPO", **changes) -> dict:
    settings = LLMTrainSettings(model=MODEL, algo=algo, **PAPER | changes)
    start = time.perf_counter()
    est = estimate(settings, prompt_tokens=PROMPT_TOKENS)
    step = max(("reference", "forward_backward", "optimizer"), key=lambda p: est.phases[p].peak_bytes)
    precision = (f"{settings.weights_dtype} weights, {settings.dtype} passes" if settings.precision == "mixed"
                 else settings.dtype)
    print(label, precision, flush=True)
    return {"row": label, "precision": precision, "changes": changes,
            "step_peak_gib": est.phases[step].peak_bytes / GIB, "phase": step,
            "top": _top(est.phases[step].categories), "all_phases_gib": est.peak_bytes / GIB,
            "all_phases_phase": est.peak_phase, "reserved_gib": est.reserved_bytes / GIB,
            "simulated_s": time.perf_counter() - start}


def _trl(label: str, dtype: str, beta: float, shapes: Shapes, **overrides) -> dict:
    args = grpo_args(**overrides)
    start = time.perf_counter()
    step = simulate_trl(args, model_config(MODEL), shapes, dtype=getattr(torch, dtype), beta=beta, target="cuda")
    peak = step.phases[step.peak_phase]
    precision = f"{dtype} weights, bfloat16 autocast" if args.bf16 and dtype != "bfloat16" else dtype
    print(label, precision, flush=True)
    return {"row": label, "precision": precision, "beta": beta,
            "gradient_checkpointing": args.activation_checkpointing, "micro_batch": args.per_device_train_batch_size,
            "generation_batch": args.generation_batch_size, "completion_tokens": shapes.completion_tokens,
            "step_peak_gib": step.peak_bytes / GIB, "phase": step.peak_phase, "top": _top(peak.categories),
            "phases_gib": {p: step.phases[p].peak_bytes / GIB for p in TRL_PHASES if p in step.phases},
            "reserved_gib": (step.allocator_reserved + EXTRA) / GIB, "simulated_s": time.perf_counter() - start}


def rows() -> list[dict]:
    out = []
    for dtype in DTYPES:
        out.append(_ours("(a) this project's HAEPO, paper settings", "HAEPO", dtype=dtype))
        out.append(_ours("(a) this project's GRPO, paper settings", dtype=dtype))
        changes = {"dtype": dtype}
        for label, change in SWITCH_ROWS:
            changes |= change
            out.append(_ours(f"(a) {label}", **changes))
        out.append(_trl("(b) TRL GRPO, paper settings, beta 0.01", dtype, 0.01, Shapes(PROMPT_TOKENS, 48),
                        bf16=dtype == "bfloat16", **TRL_PAPER))
        defaults = grpo_args()
        for beta in (0.0, 0.04):
            out.append(_trl(f"(c) TRL GRPO, TRL defaults, beta {beta}", dtype, beta,
                            Shapes(PROMPT_TOKENS, defaults.max_completion_length)))
        for checkpointing in (True, False):
            out.append(_trl(f"(c) TRL GRPO, TRL defaults, beta 0.04, completions of {EARLIER_COMPLETION}"
                            + ("" if checkpointing else ", no checkpointing"), dtype, 0.04,
                            Shapes(PROMPT_TOKENS, EARLIER_COMPLETION), max_completion_length=EARLIER_COMPLETION,
                            gradient_checkpointing=checkpointing))
    return out


def table(results: list[dict]) -> str:
    lines = ["| row | precision | step peak GiB | phase of the step peak | largest at it (GiB) "
             "| all phases GiB (phase) | reserved + context GiB |", "|---|---|---|---|---|---|---|"]
    for r in results:
        whole = f"{r['all_phases_gib']:.1f} ({r['all_phases_phase']})" if "all_phases_gib" in r else "-"
        lines.append(f"| {r['row']} | {r['precision']} | {r['step_peak_gib']:.1f} | {r['phase']} | {r['top']} | "
                     f"{whole} | {r['reserved_gib']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=".haepo/bench/trl_walk.json")
    args = parser.parse_args()
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True).stdout.strip()
    results = rows()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "commit": commit, "model": MODEL,
                                          "prompt_tokens": PROMPT_TOKENS, "rows": results}, indent=1))
    print()
    print(table(results))


if __name__ == "__main__":
    main()
