"""Peak memory per phase and time per update of HAEPO, GRPO and DPO on one model, side by side.

Each algorithm runs ``haepo_ray.llm.train.train`` in a fresh process (so that one's CPU
high-water mark or CUDA cache does not leak into the next) with the same model, prompts
(same seed), group size, dtype and completion length (``min_new_tokens = max_new_tokens``),
no SFT, and ``--updates`` RL updates. Reported per algorithm: the peak over updates of each
phase (MB; CUDA ``max_memory_allocated``, CPU the process VmHWM), the overall peak and its ratio
to GRPO's, the overall reserved peak (CUDA ``max_memory_reserved``; CPU the same VmHWM), and the
median time per update (the first update, which warms up, left out).

    .venv/bin/python bench/llm_memory.py --model tiny --updates 5
    .venv/bin/python bench/llm_memory.py --model smollm2 --updates 3
    python bench/llm_memory.py --device cuda --dtype bfloat16 --model Qwen/Qwen2.5-1.5B --updates 10 \\
        --new-tokens 64 --group-size 4 --batch-prompts 4

Results (markdown table and JSON) go to ``--out`` (default ``.haepo/bench/llm_memory``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
from pathlib import Path

PHASES = ("generation", "reference", "forward_backward", "optimizer")


def _run(settings_kwargs: dict, out_dir: str) -> None:
    from haepo_ray.llm.train import LLMTrainSettings, train

    train(LLMTrainSettings(**settings_kwargs), out_dir)


def run_algorithm(label: str, args: argparse.Namespace, out: Path) -> dict:
    algo, _, micro = label.partition(":")
    kwargs = dict(algo=algo, model=args.model, device=args.device, dtype=args.dtype, sft_examples=0,
                  rl_updates=args.updates, batch_prompts=args.batch_prompts, group_size=args.group_size,
                  max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                  micro_batch_size=int(micro) if micro else args.micro_batch_size, eval_prompts=1, seed=args.seed,
                  max_source_words=args.source_words)
    run_dir = out / label.replace(":", "-mb")
    process = multiprocessing.get_context("spawn").Process(target=_run, args=(kwargs, str(run_dir)))
    process.start()
    process.join()
    if process.exitcode != 0:
        raise SystemExit(f"{label} failed (exit code {process.exitcode})")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["phase"] == "rl"]
    peaks = {p: max(r["peak_memory_mb"][p] for r in rl) for p in PHASES}
    times = [r["time_s"] for r in rl[1:]] or [rl[0]["time_s"]]
    return {"algo": label, "peak_mb": peaks, "overall_peak_mb": max(peaks.values()),
            "overall_reserved_mb": max(max(r["peak_memory_reserved_mb"].values()) for r in rl),
            "time_per_update_s": statistics.median(times), "reward_mean": statistics.mean(r["reward_mean"] for r in rl)}


def table(results: list[dict]) -> str:
    grpo = next((r["overall_peak_mb"] for r in results if r["algo"] == "GRPO"), None)
    lines = ["| algorithm | generation | reference | forward/backward | optimizer | peak (MB) | peak / GRPO "
             "| reserved (MB) | s / update |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        ratio = f"{r['overall_peak_mb'] / grpo:.2f}" if grpo else "-"
        cells = " | ".join(f"{r['peak_mb'][p]:.0f}" for p in PHASES)
        lines.append(f"| {r['algo']} | {cells} | {r['overall_peak_mb']:.0f} | {ratio} | {r['overall_reserved_mb']:.0f} "
                     f"| {r['time_per_update_s']:.2f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--algos", nargs="+", default=["HAEPO", "GRPO", "DPO"],
                        help="ALGO or ALGO:K (K completions per backward pass for that run only)")
    parser.add_argument("--updates", type=int, default=5)
    parser.add_argument("--batch-prompts", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--source-words", type=int, default=300)
    parser.add_argument("--micro-batch-size", type=int, default=0,
                        help="completions per backward pass for every algorithm (default 0: the whole update)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=".haepo/bench/llm_memory")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for algo in args.algos:
        results.append(run_algorithm(algo, args, out))
        print(f"{algo}: {json.dumps(results[-1])}", flush=True)
    text = table(results)
    (out / "results.json").write_text(json.dumps({"settings": vars(args), "results": results}, indent=2) + "\n")
    (out / "results.md").write_text(text + "\n")
    print(f"\n{' '.join(sys.argv)}\n\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
