"""``haepo llm memory``: a trial's GPU memory and time per phase, simulated before launch
(:mod:`haepo_ray.llm.capacity`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any

from haepo_ray.cli.errors import UsageError
from haepo_ray.cli.llm_options import add_settings_options, settings_from_args
from haepo_ray.llm.settings import ALGORITHMS, MEMORY_FIELDS
from haepo_ray.tables import format_table

__all__ = ["add_parser"]

GIB = 2**30
# the parts of the reserved estimate, as the summary names them
_RESERVED_LABELS = (("allocator", "allocator_reserved"), ("cuBLAS", "cublas_workspace_bytes"),
                    ("all-reduce", "allreduce_reserved_bytes"), ("CUDA context", "cuda_context_bytes"),
                    ("NCCL", "nccl_buffer_bytes"))
# The settings that change a step's memory (the algorithm: --algo) or a run's time (the rest change neither).
_FIELDS = (*(name for name in MEMORY_FIELDS if name != "algo"), "sft_examples", "rl_updates")


def _switches(args: argparse.Namespace) -> str:
    """The implementation switches set away from their defaults, as "name value" (none: "")."""
    from haepo_ray.llm.settings import SWITCHES

    changed = [f"{name} {getattr(args, name)}" for name, values in SWITCHES.items() if getattr(args, name) != values[0]]
    changed += [f"num_iterations {args.num_iterations}"] if args.num_iterations != 1 else []
    changed += [f"logits_chunk {args.logits_chunk}"] if args.logits == "chunked" else []
    return f"; {', '.join(changed)}" if changed else ""


def _rows(results: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    from haepo_ray.llm.capacity.tracker import CATEGORIES

    shown = [c for c in CATEGORIES if any(p.categories[c] for r in results for p in r["estimate"].phases.values())]
    # (a category that is never live, e.g. buffers, is left out)
    headers = ["algo", "phase", "peak GiB", *(f"{c} GiB" for c in shown), "TFLOP", "s"]
    rows = []
    for r in results:
        est, seconds = r["estimate"], r["seconds"]
        for name, p in est.phases.items():
            mark = " *" if name == est.peak_phase else ""
            rows.append([est.algo, name + mark, p.peak_bytes / GIB, *(p.categories[c] / GIB for c in shown),
                         p.flops / 1e12, seconds[name]])
    return headers, rows


def cmd_llm_memory(args: argparse.Namespace) -> int:
    from haepo_ray.llm.capacity.accelerators import ACCELERATORS, phase_seconds, run_seconds
    from haepo_ray.llm.capacity.estimate import estimate

    accelerator = ACCELERATORS[args.accelerator]
    if not 0 < args.efficiency <= 1:
        raise UsageError(f"--efficiency must be in (0, 1], got {args.efficiency}")
    if args.prompt_tokens < 1 or args.workers < 1:
        raise UsageError("--prompt-tokens and --workers must be >= 1")
    results = []
    for algo in dict.fromkeys(args.algo):
        no_kl = {"beta_kl": 0.0} if args.reference == "none" else {}  # which reference none needs; no memory
        settings = settings_from_args(args, _FIELDS, algo=algo, **no_kl)
        start = time.perf_counter()
        try:
            est = estimate(settings, prompt_tokens=args.prompt_tokens, workers=args.workers, target=args.target)
        except ValueError as err:  # unknown model, batch that does not split over the workers
            raise UsageError(str(err)) from None
        worker = dataclasses.replace(settings, batch_prompts=settings.batch_prompts // args.workers)
        seconds = phase_seconds(est, worker, accelerator, args.efficiency)
        results.append({"estimate": est, "seconds": seconds, "run_s": run_seconds(seconds, worker),
                        "simulated_in_s": time.perf_counter() - start})
    if args.json:
        json.dump({"accelerator": dataclasses.asdict(accelerator), "efficiency": args.efficiency,
                   "prompt_tokens": args.prompt_tokens, "workers": args.workers,
                   "settings": {name: getattr(args, name) for name in _FIELDS},
                   "results": [{**r["estimate"].to_dict(), "seconds": r["seconds"], "run_s": r["run_s"],
                                "simulated_in_s": r["simulated_in_s"]} for r in results]},
                  sys.stdout, indent=2)
        print()
        return 0
    s = args
    print(f"{s.model}, {s.dtype}, {s.batch_prompts} prompts x {s.group_size} completions per update "
          f"({s.workers} worker(s)), {s.prompt_tokens} prompt + {s.max_new_tokens} completion tokens, micro-batch "
          f"{s.micro_batch_size or 'whole update'}, gradient checkpointing {'on' if s.gradient_checkpointing else 'off'}"
          f", LoRA {f'r={s.lora_r}' if s.lora_r else 'off'}{_switches(s)}; target {args.target}")
    print(f"time on {accelerator.name}: {accelerator.bf16_flops / 1e12:.0f} TFLOP/s bf16 at {args.efficiency:.0%} "
          f"efficiency, generation at least the weights read per token at {accelerator.bandwidth / 1e9:.0f} GB/s")
    print(format_table(*_rows(results)))
    limit = accelerator.memory_gib
    for r in results:
        est = r["estimate"]
        peak, reserved = est.allocated_bytes / GIB, est.reserved_bytes / GIB
        parts = ", ".join(f"{label} {getattr(est, name) / GIB:.2f}" for label, name in _RESERVED_LABELS
                          if getattr(est, name))
        print(f"{est.algo}: allocated peak {peak:.2f} GiB in {est.peak_phase}; reserved {reserved:.2f} GiB "
              f"({parts}) ({'fits' if reserved <= limit else 'does not fit'} {limit:g} GiB), "
              f"{est.update_flops / 1e12:.1f} TFLOP per update, at least "
              f"{r['run_s'] / 60:.1f} min for {s.sft_examples} SFT examples + {s.rl_updates} updates "
              f"[simulated in {r['simulated_in_s']:.1f} s]")
    print("* the phase that sets the peak. Reserved: the caching allocator's segments replayed over the step, "
          "and the CUDA context, cuBLAS workspaces, NCCL buffers as stated in haepo_ray/llm/capacity/estimate.py; "
          "the fit is on reserved.")
    return 0


def add_parser(llm_sub: Any) -> None:
    """Add ``memory`` to ``haepo llm``'s sub-commands."""
    from haepo_ray.llm.capacity.accelerators import ACCELERATORS, DEFAULT_ACCELERATOR, EFFICIENCY
    from haepo_ray.llm.capacity.estimate import PROMPT_TOKENS

    p = llm_sub.add_parser(
        "memory", help="simulate a trial's GPU memory and time per phase, without a GPU",
        description="Runs one trial's steps (an SFT step, one generate call, the reference pass "
                    "and the RL update) on fake tensors of the model's architecture: peak memory per phase "
                    "and category, FLOPs, and a time estimate. Models: tiny, smollm2, qwen2.5-1.5b(-instruct), "
                    "llama-3.2-1b(-instruct), or a local folder / Hugging Face name with a config.json.",
    )
    p.add_argument("--algo", nargs="+", choices=ALGORITHMS, default=list(ALGORITHMS),
                   help="algorithms to simulate (default: all three)")
    add_settings_options(p, _FIELDS)
    p.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS, help="prompt length (default: %(default)s)")
    p.add_argument("--workers", type=int, default=1, help="Ray Train workers of the trial; each holds a "
                   "copy of the model and 1/workers of the prompts (default: 1)")
    p.add_argument("--target", choices=("cuda", "cpu"), default="cuda",
                   help="cuda: CUDA's allocator and attention kernels (default); cpu: this machine's")
    p.add_argument("--accelerator", choices=sorted(ACCELERATORS), default=DEFAULT_ACCELERATOR,
                   help="GPU for the time estimate and the fit (default: %(default)s, the paper's)")
    p.add_argument("--efficiency", type=float, default=EFFICIENCY,
                   help="fraction of the GPU's peak FLOP/s a training pass reaches (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=cmd_llm_memory)
