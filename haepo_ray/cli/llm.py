"""``haepo llm train``: the language-model experiment from the command line (``haepo llm
memory`` and the evaluation form have modules of their own)."""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

from haepo_ray.cli import llm_eval, llm_memory
from haepo_ray.cli.args import check_out_folder
from haepo_ray.cli.llm_options import add_settings_options, settings_from_args
from haepo_ray.llm.run_log import GENERATIONS_FILE, METRICS_FILE
from haepo_ray.llm.settings import LLMTrainSettings

__all__ = ["add_parser"]

_TRAIN_FIELDS = tuple(f.name for f in dataclasses.fields(LLMTrainSettings))  # every field


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
    from haepo_ray.llm.train import train

    settings = settings_from_args(args, _TRAIN_FIELDS)
    out = check_out_folder(args.out or Path(".haepo") / "llm" / f"{args.algo}-{time.strftime('%Y%m%d-%H%M%S')}",
                           records=(METRICS_FILE, GENERATIONS_FILE))
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
    add_settings_options(p, _TRAIN_FIELDS)
    p.add_argument("--out", metavar="DIR", help="output folder, not one that holds a run's metrics "
                                                "(default .haepo/llm/ALGO-TIME)")
    p.set_defaults(func=cmd_llm_train)
    llm_memory.add_parser(llm_sub)
    llm_eval.add_parsers(llm_sub)
