"""The paper's TL;DR VRAM and time, simulated: HAEPO, GRPO and DPO on Qwen2.5-1.5B and Llama-3.2-1B.

The paper (Sec. "LLM TL;DR"): batch 4, 1000 SFT examples + 1000 RL updates, A100 40 GB;
HAEPO 28 GB peak against GRPO's 38 GB and DPO's 26 GB (HAEPO/GRPO = 0.74), 20 / 25 / 28 minutes.
What it does not say, and is assumed here (each a column or option): 4 completions per prompt,
prompts of 512 tokens, completions and gold summaries of 48, AdamW with its moments in the
weights' dtype, no LoRA, no gradient checkpointing, float32 or bfloat16 weights, and the
update's backward over the whole batch (micro-batch 0) or one completion at a time (1, this
project's default). Times are haepo_ray.llm.capacity.accelerators' roofline at 40% of the
A100's bf16 peak (a lower bound).

    .venv/bin/python bench/paper_vram.py            # the table (markdown) and a group-size sweep
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from haepo_ray.llm.capacity.accelerators import ACCELERATORS, phase_seconds, run_seconds
from haepo_ray.llm.capacity.estimate import estimate
from haepo_ray.llm.settings import LLMTrainSettings

GIB = 2**30
PAPER_GB = {"HAEPO": 28, "GRPO": 38, "DPO": 26}
PAPER_MIN = {"HAEPO": 20, "GRPO": 25, "DPO": 28}


def _row(model: str, algo: str, **settings) -> dict:
    s = LLMTrainSettings(model=model, algo=algo, batch_prompts=4, group_size=settings.pop("group_size", 4),
                         max_new_tokens=48, **settings)
    start = time.perf_counter()
    est = estimate(s, prompt_tokens=512)
    elapsed = time.perf_counter() - start
    seconds = phase_seconds(est, s, ACCELERATORS["a100-40gb"])
    peak = est.phases[est.peak_phase]
    top = sorted(((b / GIB, c) for c, b in peak.categories.items() if b), reverse=True)[:3]
    return {"model": model, "algo": algo, "dtype": s.dtype, "micro_batch_size": s.micro_batch_size,
            "group_size": s.group_size, "peak_gib": est.peak_bytes / GIB, "phase": est.peak_phase,
            "top": ", ".join(f"{c} {g:.1f}" for g, c in top), "tflop_per_update": est.update_flops / 1e12,
            "minutes": run_seconds(seconds, s) / 60, "simulated_s": elapsed,
            "forward_backward_gib": est.phases["forward_backward"].peak_bytes / GIB}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=".haepo/bench/paper_vram.json")
    args = parser.parse_args()
    rows = []
    for model in ("qwen2.5-1.5b", "llama-3.2-1b"):
        for dtype in ("float32", "bfloat16"):
            for micro in (0, 1):
                for algo in ("HAEPO", "GRPO", "DPO"):
                    rows.append(_row(model, algo, dtype=dtype, micro_batch_size=micro))
                    print(json.dumps(rows[-1]), flush=True)
    sweep = []
    for group in (4, 8, 16):  # where GRPO's per-token entropy (a softmax over the vocabulary) grows
        for algo in ("HAEPO", "GRPO"):
            sweep.append(_row("qwen2.5-1.5b", algo, dtype="bfloat16", micro_batch_size=0, group_size=group))
            print(json.dumps(sweep[-1]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"table": rows, "group_sweep": sweep}, indent=1))
    print("\n| model | dtype | micro-batch | algo | peak GiB (paper GB) | phase of the peak | largest at the peak (GiB) "
          "| TFLOP/update | min on A100 (paper) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['dtype']} | {r['micro_batch_size'] or 'whole update'} | {r['algo']} | "
              f"{r['peak_gib']:.1f} ({PAPER_GB[r['algo']]}) | {r['phase']} | {r['top']} | {r['tflop_per_update']:.0f} | "
              f"{r['minutes']:.0f} ({PAPER_MIN[r['algo']]}) |")
    print("\nHAEPO/GRPO peak ratio (paper 0.74):")
    for i in range(0, len(rows), 3):
        h, g = rows[i], rows[i + 1]
        print(f"  {h['model']} {h['dtype']} micro-batch {h['micro_batch_size']}: {h['peak_gib'] / g['peak_gib']:.3f}; "
              f"update phase alone {h['forward_backward_gib'] / g['forward_backward_gib']:.3f}")
    print("\nGroup size, Qwen2.5-1.5B bfloat16, whole update: HAEPO vs GRPO peak GiB (update phase GiB)")
    for i in range(0, len(sweep), 2):
        h, g = sweep[i], sweep[i + 1]
        print(f"  G={h['group_size']}: {h['peak_gib']:.1f} ({h['forward_backward_gib']:.1f}) vs "
              f"{g['peak_gib']:.1f} ({g['forward_backward_gib']:.1f}): ratio {h['peak_gib'] / g['peak_gib']:.3f}")


if __name__ == "__main__":
    main()
