"""Mixed and pure half precision against float32 on SmolLM2-135M-Instruct: float16's gradients with
and without loss scaling, and the steps pure bfloat16 weights do not take.

float16. One batch of ACLSum (``--prompts`` prompts with the chat template, sources cut to 64
words; per prompt its gold summary and ``--samples`` completions of up to 16 new tokens sampled
from the model at seed 0), the gradient of every weight for SFT's loss (the NLL of the gold
summaries) and for HAEPO's, GRPO's and DPO's (groups of [gold, samples], rewards the token F1 to
the gold; DPO prefers the gold to each sample), computed by :class:`haepo_ray.llm.policy.Policy`:

- ``float32``: the reference;
- ``float16 unscaled``: precision mixed (float32 weights, passes in float16), no loss scaling;
- ``float16 scaled``: the same with the policy's loss scaler, from torch's initial scale 2**16
  halved while a gradient is inf or NaN (as a run does); the gradients unscaled;
- ``bfloat16``: precision mixed in bfloat16 (no scaling: bfloat16 has float32's range).

Per objective and precision: the share of gradient entries that are 0 where float32's is not
(AdamW scales each entry alone, so such a weight does not move), the relative error
||g - g32|| / ||g32|| in float64, and the halvings the scaler needed.

bfloat16. Per learning rate (``--lrs``), one GRPO update of the same batch with pure bfloat16
weights rounded to nearest (torch's AdamW) and stochastically (``rounding`` stochastic), and with
precision mixed: the share of the weights it left unchanged, beside the share
:func:`haepo_ray.llm.precision.frozen_share` predicts for rounding to nearest; and the share of
the float32 step (torch's AdamW on float32 copies of the pure bfloat16 weights and gradients)
that each rounding took, sum_i dw_i sign(s_i) / sum_i |s_i|, s the float32 step. Then the time of
one AdamW step on every weight (bfloat16, random gradients): torch's against stochastic rounding's,
alternated ``--repeats`` times, median wall and CPU seconds.

    .venv/bin/python bench/llm_precision.py OUT.json [--prompts 2] [--samples 3] [--lrs 1e-6 1e-5 ...]
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from haepo_ray.llm.data import format_prompt, load_examples
from haepo_ray.llm.models import load_model
from haepo_ray.llm.objectives import group_loss
from haepo_ray.llm.policy import Policy
from haepo_ray.llm.precision import frozen_share
from haepo_ray.llm.rewards import token_f1
from haepo_ray.llm.rollout import completion_batch
from haepo_ray.llm.settings import LLMTrainSettings
from haepo_ray.llm.stochastic_rounding import StochasticRoundingAdamW

ROOT = Path(__file__).resolve().parents[1]
PRECISIONS = {"float32": {"dtype": "float32"}, "float16 unscaled": {"dtype": "float16", "precision": "mixed"},
              "float16 scaled": {"dtype": "float16", "precision": "mixed"},
              "bfloat16": {"dtype": "bfloat16", "precision": "mixed"}}
OBJECTIVES = ("SFT", "HAEPO", "GRPO", "DPO")


def _batch(model: Any, tokenizer: Any, prompts: int, samples: int) -> tuple[Any, list[float]]:
    examples = load_examples("aclsum", aspect="challenge")[:prompts]
    texts = [format_prompt(e, tokenizer, 64) for e in examples]
    rows_prompts, rows, returns = [], [], []
    torch.manual_seed(0)
    for example, text in zip(examples, texts, strict=True):
        ids = tokenizer(text, return_tensors="pt")
        out = model.generate(**ids, do_sample=True, max_new_tokens=16, num_return_sequences=samples,
                             pad_token_id=tokenizer.pad_token_id)
        sampled = tokenizer.batch_decode(out[:, ids["input_ids"].shape[1]:], skip_special_tokens=True)
        for completion in [example.reference, *sampled]:
            rows_prompts.append(text)
            rows.append(completion)
            returns.append(token_f1(completion, example.reference))
    batch = completion_batch(tokenizer, rows_prompts, rows)
    group = samples + 1
    return type(batch)(batch.input_ids, batch.attention_mask, batch.completion_mask,
                       torch.arange(len(rows)) // group), returns


def _gradients(model: Any, batch: Any, returns: list[float], objective: str, precision: str,
               group: int) -> tuple[torch.Tensor, int]:
    """The objective's gradient of every weight (float64, unscaled) and the scaler's halvings."""
    settings = LLMTrainSettings(algo="GRPO" if objective == "SFT" else objective, model="smollm2",
                                micro_batch_size=0, **PRECISIONS[precision])
    policy = Policy(copy.deepcopy(model), settings)
    policy.loss_scaling = precision == "float16 scaled"
    policy.start_sft()
    policy.start_rl()
    if objective == "SFT":
        gold = batch.rows(torch.arange(0, len(batch), group))
        tokens = gold.completion_mask.sum()
        step_batch, loss_fn = gold, lambda logp, entropy: -logp.sum() / tokens
    else:
        target = torch.tensor([float(i % group == 0) for i in range(len(batch))]) if objective == "DPO" \
            else torch.tensor(returns)
        step_batch = batch
        loss_fn = group_loss(settings.objective(), batch, target, policy.reference_logp(batch), group_rows=group)
    halvings = 0
    while True:
        policy.gradients(step_batch, loss_fn)
        policy.scaler.unscale_(policy.optimizer)
        gradients = torch.cat([p.grad.flatten().double() for p in policy.trainable()])
        if gradients.isfinite().all() or not policy.loss_scaling:
            return gradients, halvings
        policy.scaler.update()  # halves the scale: an inf was found
        policy.optimizer.zero_grad(set_to_none=True)
        halvings += 1


def _weights(policy: Policy) -> torch.Tensor:
    return torch.cat([p.detach().flatten().double() for p in policy.trainable()])


BFLOAT16 = {"pure": {"precision": "pure"}, "stochastic": {"precision": "pure", "rounding": "stochastic"},
            "mixed": {"precision": "mixed"}}


def _bfloat16_step(model: Any, batch: Any, returns: list[float], lr: float, weights: str,
                   group: int) -> torch.Tensor:
    """What one GRPO update at ``lr`` adds to each weight (float64) with :data:`BFLOAT16` ``weights``,
    or (``float32 step``) with torch's AdamW on float32 copies of pure bfloat16's weights and gradients."""
    exact = weights == "float32 step"
    settings = LLMTrainSettings(algo="GRPO", model="smollm2", micro_batch_size=0, lr=lr, dtype="bfloat16",
                                **BFLOAT16["pure" if exact else weights])
    policy = Policy(copy.deepcopy(model).to(getattr(torch, settings.weights_dtype)), settings)
    policy.start_sft()
    policy.start_rl()
    before = _weights(policy)
    loss_fn = group_loss(settings.objective(), batch, torch.tensor(returns), policy.reference_logp(batch),
                         group_rows=group)
    if not exact:
        policy.update(batch, loss_fn)
        return _weights(policy) - before
    policy.gradients(batch, loss_fn)
    copies = [torch.nn.Parameter(p.detach().float()) for p in policy.trainable()]
    for copied, p in zip(copies, policy.trainable(), strict=True):
        copied.grad = p.grad.float()
    torch.optim.AdamW(copies, lr=lr).step()
    return torch.cat([c.detach().flatten().double() for c in copies]) - before


def _step_seconds(model: Any, repeats: int) -> dict[str, dict[str, float]]:
    """Median wall and CPU seconds of one AdamW step on ``model``'s weights in bfloat16, rounded to
    nearest (torch's) and stochastically, the two alternated."""
    generator = torch.Generator().manual_seed(0)
    optimizers = {}
    for rounding in ("nearest", "stochastic"):
        params = [torch.nn.Parameter(p.detach().to(torch.bfloat16)) for p in model.parameters()]
        for p in params:
            p.grad = (1e-3 * torch.randn(p.shape, generator=generator)).to(torch.bfloat16)
        optimizers[rounding] = torch.optim.AdamW(params, lr=5e-5) if rounding == "nearest" else \
            StochasticRoundingAdamW(params, lr=5e-5, seed=0)
        optimizers[rounding].step()  # the moments exist: the steady state
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in optimizers}
    for _ in range(repeats):
        for name, optimizer in optimizers.items():
            wall, cpu = time.perf_counter(), time.process_time()
            optimizer.step()
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    return {name: {"wall_s": statistics.median(t[0] for t in runs), "cpu_s": statistics.median(t[1] for t in runs)}
            for name, runs in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-6, 1e-5, 5e-5, 1e-4, 1e-3])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    model, tokenizer = load_model("smollm2")
    batch, returns = _batch(model, tokenizer, args.prompts, args.samples)
    rows = []
    for objective in OBJECTIVES:
        exact, _ = _gradients(model, batch, returns, objective, "float32", args.samples + 1)
        for precision in list(PRECISIONS)[1:]:
            g, halvings = _gradients(model, batch, returns, objective, precision, args.samples + 1)
            rows.append({"objective": objective, "precision": precision,
                         "zero_where_float32_is_not": float(((g == 0) & (exact != 0)).double().mean()),
                         "relative_error": float((g - exact).norm() / exact.norm()),
                         "non_finite": int((~g.isfinite()).sum()), "halvings": halvings})
            print(f"{objective:6} {precision:17} zero where float32 is not {rows[-1]['zero_where_float32_is_not']:8.3%}"
                  f"  relative error {rows[-1]['relative_error']:.2e}  halvings {halvings}", flush=True)
    weights = [p.detach().to(torch.bfloat16) for p in model.parameters()]
    lost = []
    for lr in args.lrs:
        steps = {name: _bfloat16_step(model, batch, returns, lr, name, args.samples + 1)
                 for name in (*BFLOAT16, "float32 step")}
        exact = steps.pop("float32 step")
        lost.append({"lr": lr, "predicted": frozen_share(weights, lr),
                     **{name: float((step == 0).double().mean()) for name, step in steps.items()},
                     **{f"{name}_step_taken": float((step * exact.sign()).sum() / exact.abs().sum())
                        for name, step in steps.items() if name != "mixed"}})
        print(f"bfloat16 lr {lr:g}: unchanged after one GRPO update: pure {lost[-1]['pure']:.2%} (predicted "
              f"{lost[-1]['predicted']:.2%}), stochastic {lost[-1]['stochastic']:.2%}, mixed {lost[-1]['mixed']:.2%}; "
              f"the float32 step taken: pure {lost[-1]['pure_step_taken']:.3f}, stochastic "
              f"{lost[-1]['stochastic_step_taken']:.3f}", flush=True)
    seconds = _step_seconds(model, args.repeats)
    print("AdamW step, median of " + str(args.repeats) + ": " + ", ".join(
        f"{name} {t['wall_s']:.3f} s wall / {t['cpu_s']:.3f} CPU-s" for name, t in seconds.items())
        + f"; stochastic / nearest {seconds['stochastic']['wall_s'] / seconds['nearest']['wall_s']:.2f}x wall",
        flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    args.out.write_text(json.dumps({"rows": rows, "bfloat16_unchanged": lost, "adamw_step_s": seconds,
                                    "commit": commit.strip(), "torch": torch.__version__,
                                    "machine": platform.processor() or platform.machine(), "argv": sys.argv[1:],
                                    "batch_rows": len(batch)}, indent=1))


if __name__ == "__main__":
    main()
