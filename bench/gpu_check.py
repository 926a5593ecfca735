"""One prepared GPU check: the memory simulator's allocated and reserved peaks, and its roofline,
against one real step of HAEPO, GRPO and DPO on a GPU, in each of :data:`CONFIGS`.

    python bench/gpu_check.py OUT_DIR [--device cuda|cpu] [--model qwen2.5-1.5b|tiny]
                              [--algo ...] [--config ...]

Needs only PyTorch, transformers and peft (no Ray, MLflow, gymnasium, trl, no network): the
model is built from its bundled config (haepo_ray/llm/capacity/configs/) with random weights
(memory and time do not depend on the weights). The settings are tune_configs/paper/tldr_*.yaml's
(4 prompts x 4 completions per update, 4 SFT rows, 48 new tokens, micro-batches of 4, no LoRA,
no gradient checkpointing) in bfloat16, prompts of 512 tokens; every completion runs to 48
tokens (min_new_tokens = max_new_tokens, as the simulator assumes).

The configurations (:data:`CONFIGS`): those settings as given (micro-batches of 4), the whole
update in one backward pass, LoRA (r 16; 2 on the tiny model), gradient checkpointing, static
decoding (``decoding`` static: a static KV cache, whose decode step transformers compiles on
CUDA; timed after the first run, which compiles), static decoding with every prompt's group
in one ``generate`` call (``generation`` batch: a decode step reads the weights once for 16
rows, not once per group of 4), AdamW with stochastic rounding (``rounding`` stochastic: its
chunked float32 step in place of torch's multi-tensor one), and a planned fit (HAEPO only:
:class:`haepo_ray.sweep.kinds.llm.fit.GPUFit` plans the whole update in one pass against
:data:`PLAN_GIB` of memory, and the step runs with its choice).

Per algorithm, on ``--device cuda``:

- simulated: :func:`haepo_ray.llm.capacity.estimate.estimate` (``target="cuda"``): allocated =
  the step's peak + cuBLAS's workspaces (the JSON's ``simulated_allocated_blocks`` counts, as
  PyTorch's statistic does, whole blocks where the allocator model does not split them: the
  allocator's replayed peak + cuBLAS); reserved = the caching allocator's replayed reserve +
  cuBLAS's workspaces (what ``torch.cuda.max_memory_reserved`` counts; the CUDA context is
  compared separately, as the device's used memory beyond PyTorch's reserve);
- measured: the same step (:func:`haepo_ray.llm.capacity.measure.run_cuda`: SFT step, one
  group's generation, reference pass, update), ``torch.cuda.max_memory_allocated`` (the
  largest phase peak) and ``max_memory_reserved``, after ``empty_cache`` and
  ``reset_peak_memory_stats`` and with the previous algorithm's model freed;
- time: one update's wall time (one ``generate`` call's time x the update's calls, 4 or 1 +
  reference + update),
  from a second run (the first pays for CUDA's lazy kernel loading and cuBLAS's heuristics),
  against :func:`~haepo_ray.llm.capacity.accelerators.phase_seconds`' roofline at its default
  efficiency for the GPU by name (H100 if the name is unknown).

``--device cpu`` runs the same on this machine's CPU (``target="cpu"`` simulation; measured
allocated from PyTorch's profiler, :func:`~haepo_ray.llm.capacity.measure.measure`; a CPU has
no caching allocator, so its "measured reserved" is the allocated peak, and the roofline is the
H100's): the pipeline's test, not a check. ``--model tiny`` uses the tiny test model, prompts
of 32 tokens, 2 prompts x 2 completions of 8 tokens.

Writes OUT_DIR/gpu_check.json and OUT_DIR/gpu_check.md, again after each row (a run cut
short keeps its rows).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import platform
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, without installing it

import torch  # noqa: E402

from haepo_ray.llm.capacity.accelerators import ACCELERATORS, EFFICIENCY, phase_seconds  # noqa: E402
from haepo_ray.llm.capacity.estimate import CUDA_CONTEXT_BYTES, estimate, memory_key  # noqa: E402
from haepo_ray.llm.capacity.measure import measure, run_cuda, time_step  # noqa: E402
from haepo_ray.llm.capacity.model_configs import model_config  # noqa: E402
from haepo_ray.llm.capacity.steps import RL_PHASES, Shapes, generation_calls, generation_rows  # noqa: E402
from haepo_ray.llm.settings import ALGORITHMS, LLMTrainSettings  # noqa: E402
from haepo_ray.sweep.kinds.llm.fit import GPUFit, estimate_keys  # noqa: E402

GIB = 2**30
# tune_configs/paper/tldr_*.yaml's memory settings; (prompt tokens, settings) per model
PAPER = dict(batch_prompts=4, group_size=4, sft_batch=4, max_new_tokens=48, micro_batch_size=4)
TINY = dict(batch_prompts=2, group_size=2, sft_batch=2, max_new_tokens=8, micro_batch_size=2)
# configuration -> settings changed from the paper's (LoRA's rank by model); "planned fit": module docstring
CONFIGS = {"as given": {}, "one pass": {"micro_batch_size": 0}, "LoRA": {"lora_r": {"tiny": 2}},
           "checkpointing": {"gradient_checkpointing": True}, "static decoding": {"decoding": "static"},
           "static, batch generation": {"decoding": "static", "generation": "batch"},
           "stochastic rounding": {"rounding": "stochastic"}, "planned fit": {"micro_batch_size": 0}}
LORA_R = 16
# GiB the planned fit is held to, with no reserve: below the whole update in one pass, above the
# smallest combination; the tiny model's is set from its own estimates (:func:`_plan_limit`)
PLAN_GIB = {"qwen2.5-1.5b": 24.0}
# GPU names (torch.cuda.get_device_name) -> accelerators' table
NAMES = (("H200", "h200"), ("H100", "h100-80gb"), ("A100-SXM4-40GB", "a100-40gb"), ("A100", "a100-80gb"),
         ("L4", "l4"))


def _settings(model: str, algo: str, config: str = "as given") -> tuple[LLMTrainSettings, int]:
    fields, prompt_tokens = (TINY, 32) if model == "tiny" else (PAPER, 512)
    changes = {k: v.get(model, LORA_R) if isinstance(v, dict) else v for k, v in CONFIGS[config].items()}
    settings = LLMTrainSettings(model=model, algo=algo, dtype="bfloat16", min_new_tokens=fields["max_new_tokens"],
                                **fields | changes)
    if config == "planned fit":
        settings = _planned(settings, prompt_tokens)
    return settings, prompt_tokens


def _plan_limit(settings: LLMTrainSettings, prompt_tokens: int) -> float:
    """:data:`PLAN_GIB`; for the tiny model, halfway between micro-batches of 1 with
    checkpointing and ``settings``."""
    if settings.model in PLAN_GIB:
        return PLAN_GIB[settings.model]
    keys = [memory_key(settings), memory_key(dataclasses.replace(settings, micro_batch_size=1,
                                                                 gradient_checkpointing=True))]
    given, smallest = (e.reserved_gib for e in estimate_keys(keys, prompt_tokens=prompt_tokens, workers=0).values())
    return (given + smallest) / 2


def _planned(settings: LLMTrainSettings, prompt_tokens: int) -> LLMTrainSettings:
    """``settings`` with what the planner chooses for them against :func:`_plan_limit`."""
    key = memory_key(settings)
    limit = _plan_limit(settings, prompt_tokens)
    fit = GPUFit(limit, "gpu_check", 0.0, prompt_tokens, estimate_keys([key], prompt_tokens=prompt_tokens, workers=0),
                 mode="auto").planned([key], workers=0)
    if fit.refused(key):
        raise ValueError(f"no plan fits {limit:.3g} GiB: {fit.refusal(key)}")
    chosen = fit.fit_config(key)
    return dataclasses.replace(settings, micro_batch_size=chosen["micro_batch_size"],
                               gradient_checkpointing=chosen["gradient_checkpointing"])


def _accelerator(device: str) -> str:
    if device == "cuda":
        name = torch.cuda.get_device_name()
        return next((key for part, key in NAMES if part in name), "h100-80gb")
    return "h100-80gb"


def _free_cuda() -> None:
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def _update_seconds(seconds: dict[str, float], settings: LLMTrainSettings) -> float:
    """One update from a measured step: its ``generate`` calls (one call measured), the reference pass, the update."""
    return sum(seconds[p] * (generation_calls(settings) if p == "generation" else 1) for p in RL_PHASES)


def check(algo: str, model: str, device: str, configuration: str = "as given") -> dict:
    settings, prompt_tokens = _settings(model, algo, configuration)
    shapes = Shapes(prompt_tokens, settings.max_new_tokens)
    config = model_config(model)
    start = time.perf_counter()
    est = estimate(settings, prompt_tokens=prompt_tokens, target=device)
    simulated_in = time.perf_counter() - start
    row: dict = {"algo": algo, "config": configuration, "simulated_in_s": simulated_in,
                 "micro_batch_size": settings.micro_batch_size, "lora_r": settings.lora_r,
                 "gradient_checkpointing": settings.gradient_checkpointing,
                 "simulated_allocated": est.allocated_bytes, "simulated_reserved": est.torch_reserved_bytes,
                 "simulated_peak_phase": est.peak_phase, "allocator_allocated": est.allocator_allocated,
                 "simulated_allocated_blocks": est.allocator_allocated + est.cublas_workspace_bytes,
                 "cublas_workspace_bytes": est.cublas_workspace_bytes}
    if device == "cuda":
        _free_cuda()
        before = torch.cuda.memory_reserved()
        real = run_cuda(settings, config, shapes)
        free, total = torch.cuda.mem_get_info()
        row |= {"measured_allocated": real.max_allocated, "measured_reserved": real.max_reserved,
                "reserved_before": before,
                "measured_phase_peaks": {p: m.peak_bytes for p, m in real.peaks.items()},
                # the device's used memory beyond PyTorch's reserve: the CUDA context and libraries' own
                "device_used_beyond_reserved": (total - free) - torch.cuda.memory_reserved(),
                "cuda_context_assumed": CUDA_CONTEXT_BYTES}
        del real
        _free_cuda()
        seconds = run_cuda(settings, config, shapes).seconds
        _free_cuda()
    else:
        peaks = measure(settings, config, shapes)
        allocated = max(p.peak_bytes for p in peaks.values())
        row |= {"measured_allocated": allocated, "measured_reserved": allocated,
                "measured_phase_peaks": {p: m.peak_bytes for p, m in peaks.items()}}
        seconds = time_step(settings, config, shapes)
    accelerator = ACCELERATORS[_accelerator(device)]
    roofline = phase_seconds(est, settings, accelerator, EFFICIENCY)
    row |= {"update_s": _update_seconds(seconds, settings), "roofline_s": sum(roofline[p] for p in RL_PHASES),
            "phase_s": seconds, "roofline_phase_s": roofline, "decoding": settings.decoding,
            "rounding": settings.rounding,
            # one generate call's new tokens (every completion runs to max_new_tokens) per second
            "new_tokens_per_s": generation_rows(settings) * settings.max_new_tokens / seconds["generation"]}
    for name, (a, b) in {"allocated_ratio": ("simulated_allocated", "measured_allocated"),
                         "reserved_ratio": ("simulated_reserved", "measured_reserved"),
                         "time_ratio": ("update_s", "roofline_s")}.items():
        row[name] = row[a] / row[b]
    return row


def _table(result: dict) -> str:
    head = ["config", "algo", "micro-batch", "sim alloc GiB", "meas alloc GiB", "sim/meas", "sim reserved GiB",
            "meas reserved GiB", "sim/meas", "new tokens/s", "update wall s", "roofline s", "wall/roofline"]
    lines = [f"GPU check on {result['device_name']} ({result['device']}), model {result['model']}, torch "
             f"{result['torch']}, transformers {result['transformers']}; roofline: {result['accelerator']} at "
             f"{result['efficiency']:.0%} of peak", "", "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['config']} | {r['algo']} | error: {r['error']} |" + " |" * (len(head) - 3))
            continue
        batch = f"{r['micro_batch_size'] or 'whole'}" + (", checkpointing" if r["gradient_checkpointing"] else "")
        cells = [r["config"], r["algo"], batch,
                 *(f"{r[k] / GIB:.4g}" for k in ("simulated_allocated", "measured_allocated")),
                 f"{r['allocated_ratio']:.3f}",
                 *(f"{r[k] / GIB:.4g}" for k in ("simulated_reserved", "measured_reserved")),
                 f"{r['reserved_ratio']:.3f}", f"{r['new_tokens_per_s']:.0f}", f"{r['update_s']:.3f}",
                 f"{r['roofline_s']:.4f}",
                 f"{r['time_ratio']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _write(result: dict, out_dir: Path) -> str:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gpu_check.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    table = _table(result)
    (out_dir / "gpu_check.md").write_text(table)
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--model", choices=("qwen2.5-1.5b", "tiny"), default="qwen2.5-1.5b")
    parser.add_argument("--algo", nargs="+", choices=ALGORITHMS, default=list(ALGORITHMS))
    parser.add_argument("--config", nargs="+", choices=tuple(CONFIGS), default=list(CONFIGS))
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device")
    import transformers

    started = time.perf_counter()
    result = {"device": args.device, "model": args.model,
              "device_name": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu",
              "torch": torch.__version__, "transformers": transformers.__version__,
              "accelerator": _accelerator(args.device), "efficiency": EFFICIENCY,
              "settings": dataclasses.asdict(_settings(args.model, "HAEPO")[0]) | {"algo": None},
              "prompt_tokens": _settings(args.model, "HAEPO")[1], "rows": []}
    runs = [(c, a) for c in args.config for a in args.algo if c != "planned fit" or a == "HAEPO"]
    for configuration, algo in runs:
        try:
            row = check(algo, args.model, args.device, configuration)
        except Exception as err:  # a row that fails (out of memory) leaves the others
            row = {"algo": algo, "config": configuration, "traceback": traceback.format_exc(),
                   "error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"}
            if args.device == "cuda":
                _free_cuda()
        result["rows"].append(row)
        print(json.dumps({k: v for k, v in row.items() if not isinstance(v, dict)}), flush=True)
        result["wall_s"] = time.perf_counter() - started
        table = _write(result, args.out_dir)
    print(table)
    return 0 if all("error" not in r and all(math.isfinite(r[k]) for k in ("allocated_ratio", "reserved_ratio",
                                                                            "time_ratio")) for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
