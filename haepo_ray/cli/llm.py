"""``haepo llm train``: the language-model experiment from the command line."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from haepo_ray.cli import llm_eval

__all__ = ["add_parser"]


def _print_row(row: dict[str, Any]) -> None:
    if row["phase"] == "sft":
        if row["update"] % 25 == 1:
            print(f"sft  {row['update']:5d} | loss {row['loss']:7.3f} | {row['time_s']:6.2f} s", flush=True)
        return
    peak = max(row["peak_memory_mb"].values())
    print(f"rl   {row['update']:5d} | reward {row['reward_mean']:6.3f} | rougeL {row['rouge_l']:5.3f} | "
          f"len {row['completion_length']:5.1f} | n_eff {row['effective_num_trajectories']:5.2f} | "
          f"kl {row['kl']:8.3f} | peak {peak:8.0f} MB | {row['time_s']:6.2f} s", flush=True)


def cmd_llm_train(args: argparse.Namespace) -> int:
    from haepo_ray.cli.errors import UsageError
    from haepo_ray.llm.train import LLMTrainSettings, train

    try:
        settings = LLMTrainSettings(
            algo=args.algo, model=args.model, data=args.data, sft_examples=args.sft_examples,
            rl_updates=args.rl_updates, batch_prompts=args.batch_prompts, group_size=args.group_size,
            seed=args.seed, device=args.device, dtype=args.dtype, lr=args.lr, sft_lr=args.sft_lr,
            beta_ent=args.beta_ent, beta_kl=args.beta_kl, length_normalize=args.length_normalize,
            weight_temperature=args.weight_temperature, max_new_tokens=args.max_new_tokens,
            min_new_tokens=args.min_new_tokens, max_source_words=args.max_source_words,
            micro_batch_size=args.micro_batch_size,
            eval_prompts=args.eval_prompts, eval_every=args.eval_every,
        )
    except ValueError as err:
        raise UsageError(str(err)) from None
    out = Path(args.out or Path(".haepo") / "llm" / f"{args.algo}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        train(settings, out, callback=_print_row)
    except ValueError as err:  # bad data file, model that cannot load offline, NaN reward
        raise UsageError(str(err)) from None
    print(f"metrics, generations and config in {out.resolve()}")
    return 0


def add_parser(subparsers: Any) -> None:
    """Add ``llm`` with its ``train`` sub-command to the ``haepo`` parser's sub-commands."""
    llm = subparsers.add_parser("llm", help="fine-tune a language model with HAEPO, GRPO or DPO")
    llm_sub = llm.add_subparsers(dest="llm_command", required=True, metavar="COMMAND")
    p = llm_sub.add_parser(
        "train", help="SFT warm-up then RL updates on summaries; writes metrics and generations",
        description="Supervised warm-up, then RL updates (one prompt group per prompt), writing "
                    "metrics.jsonl, generations.jsonl and config.json. Offline: --model tiny or "
                    "smollm2, --data aclsum.",
    )
    p.add_argument("--algo", choices=("HAEPO", "GRPO", "DPO"), default="HAEPO")
    p.add_argument("--model", default="smollm2",
                   help="tiny (random 2-layer test model), smollm2 (default; offline), or a HF name or path")
    p.add_argument("--data", default="aclsum", help="aclsum (default; offline) or tldr:PATH_OR_ID "
                   "(a .jsonl/.parquet file or a datasets id)")
    p.add_argument("--sft-examples", type=int, default=1000, help="supervised examples (default 1000)")
    p.add_argument("--rl-updates", type=int, default=1000, help="RL updates (default 1000)")
    p.add_argument("--batch-prompts", type=int, default=4, help="prompts per update (default 4)")
    p.add_argument("--group-size", type=int, default=4, help="completions per prompt, M (default 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    p.add_argument("--dtype", default="float32", help="float32 (default), bfloat16 or float16")
    p.add_argument("--lr", type=float, default=5e-5, help="RL learning rate (default 5e-5)")
    p.add_argument("--sft-lr", type=float, default=5e-5, help="SFT learning rate (default 5e-5)")
    p.add_argument("--beta-ent", type=float, default=1e-2)
    p.add_argument("--beta-kl", type=float, default=1e-2)
    p.add_argument("--length-normalize", action="store_true",
                   help="HAEPO: weights from L_k / length instead of the paper's plain sum")
    p.add_argument("--weight-temperature", type=float, default=1.0, help="HAEPO: weights from L_k / tau")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--min-new-tokens", type=int, default=1)
    p.add_argument("--max-source-words", type=int, default=300, help="cut each source text to N words")
    p.add_argument("--micro-batch-size", type=int, default=1,
                   help="completions per backward pass (default 1; 0 = the whole update at once)")
    p.add_argument("--eval-prompts", type=int, default=8, help="held-out prompts for generations.jsonl")
    p.add_argument("--eval-every", type=int, default=0, help="also write generations every N updates")
    p.add_argument("--out", metavar="DIR", help="output folder (default .haepo/llm/ALGO-TIME)")
    p.set_defaults(func=cmd_llm_train)
    llm_eval.add_parsers(llm_sub)
