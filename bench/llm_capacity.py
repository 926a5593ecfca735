"""The memory simulator against the real step, phase by phase: ``haepo llm memory``'s validation.

For each model, algorithm and memory saver, one trial's steps (haepo_ray.llm.capacity.steps:
an SFT step, one prompt group's generation, the reference pass, the RL update) are simulated on
fake tensors and run for real on random weights of the same architecture, and each phase's peak
of live bytes is compared:

- on this machine's CPU (default): the simulator's ``target="cpu"`` (exact bytes, CPU kernels)
  against every allocation and free of PyTorch's CPU allocator under the profiler
  (haepo_ray.llm.capacity.measure.measure);
- with ``--device cuda`` (where there is a GPU): ``target="cuda"`` against
  ``torch.cuda.max_memory_allocated`` per phase (measure_cuda).

Reported per phase: the simulated and measured peak (MiB) and their relative error, and the
same for the phase's own bytes (peak minus what was live when it began: activations,
temporaries, a new optimiser state, without the weights both count).

    .venv/bin/python bench/llm_capacity.py --model tiny smollm2            # this machine, CPU
    python bench/llm_capacity.py --model smollm2 qwen2.5-1.5b --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from haepo_ray.llm.capacity.measure import measure, measure_cuda
from haepo_ray.llm.capacity.model_configs import model_config
from haepo_ray.llm.capacity.simulate import simulate
from haepo_ray.llm.capacity.steps import PHASES, Shapes
from haepo_ray.llm.capacity.model_configs import tiny_config
from haepo_ray.llm.settings import LLMTrainSettings

MIB = 2**20
SAVERS = {
    "whole update": {"micro_batch_size": 0},
    "micro-batch 1": {"micro_batch_size": 1},
    "checkpointing": {"micro_batch_size": 0, "gradient_checkpointing": True},
    "LoRA r=8": {"micro_batch_size": 0, "lora_r": 8},
}


def _config(name: str):
    # tiny with a vocabulary 64x its hidden size, as real LMs have (the test's model)
    return tiny_config(vocab_size=4096) if name == "tiny" else model_config(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", nargs="+", default=["tiny", "smollm2"])
    parser.add_argument("--algo", nargs="+", default=["HAEPO", "GRPO", "DPO"])
    parser.add_argument("--saver", nargs="+", default=list(SAVERS), choices=list(SAVERS))
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--completion-tokens", type=int, default=24)
    parser.add_argument("--batch-prompts", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=3)
    parser.add_argument("--out", default=".haepo/bench/llm_capacity")
    args = parser.parse_args()
    shapes = Shapes(args.prompt_tokens, args.completion_tokens)
    target = args.device
    rows, worst = [], {}
    for name in args.model:
        config = _config(name)
        for saver in args.saver:
            for algo in args.algo:
                settings = LLMTrainSettings(
                    algo=algo, model=name, dtype=args.dtype, batch_prompts=args.batch_prompts,
                    group_size=args.group_size, sft_batch=args.batch_prompts, max_new_tokens=shapes.completion_tokens,
                    min_new_tokens=shapes.completion_tokens, **SAVERS[saver])
                start = time.perf_counter()
                simulated = simulate(settings, config, shapes, target=target)
                sim_s = time.perf_counter() - start
                start = time.perf_counter()
                measured = (measure_cuda if target == "cuda" else measure)(settings, config, shapes)
                real_s = time.perf_counter() - start
                for phase in PHASES:
                    sim, real = simulated.phases[phase], measured[phase]
                    own, real_own = sim.peak_bytes - sim.start_bytes, real.peak_bytes - real.start_bytes
                    row = {"model": name, "saver": saver, "algo": algo, "phase": phase,
                           "simulated_mib": sim.peak_bytes / MIB, "measured_mib": real.peak_bytes / MIB,
                           "error": sim.peak_bytes / real.peak_bytes - 1,
                           "own_simulated_mib": own / MIB, "own_measured_mib": real_own / MIB,
                           "own_error": own / real_own - 1 if real_own else 0.0,
                           "simulate_s": sim_s, "measure_s": real_s}
                    rows.append(row)
                    key = (name, phase)
                    worst[key] = max(worst.get(key, 0.0), abs(row["error"]))
                print(f"{name} {saver} {algo}: simulated in {sim_s:.1f} s, measured in {real_s:.1f} s; worst phase "
                      f"error {max(abs(r['error']) for r in rows[-len(PHASES):]):.2%}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{target}.json").write_text(json.dumps(rows, indent=1))
    table = ["| model | saver | algo | phase | simulated MiB | measured MiB | error | phase's own: sim / measured MiB | error |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        table.append(f"| {r['model']} | {r['saver']} | {r['algo']} | {r['phase']} | {r['simulated_mib']:.2f} | "
                     f"{r['measured_mib']:.2f} | {r['error']:+.2%} | {r['own_simulated_mib']:.2f} / "
                     f"{r['own_measured_mib']:.2f} | {r['own_error']:+.2%} |")
    (out / f"{target}.md").write_text("\n".join(table) + "\n")
    print("\nworst |error| of the peak by model and phase:")
    for (name, phase), error in sorted(worst.items()):
        print(f"  {name:8s} {phase:17s} {error:.2%}")
    print(f"tables in {out}/{target}.md and .json")


if __name__ == "__main__":
    main()
