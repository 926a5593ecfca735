"""The scores of a language-model trial's held-out prompts, per prompt, from its run's
``generations.jsonl`` artifact (:mod:`haepo_ray.llm.train` writes one record per prompt and
evaluation: its greedy completion's reward and its parts against the gold summary, the exact
KL of the policy's samples; the tracking callback logs the file at the run's root): those of
the trial's last evaluation and the area under each prompt's evaluation curve, which the win
rates and the bootstrap intervals over prompts of :mod:`~haepo_ray.report.llm_results` read;
and those of its SFT start's evaluation (update 0, settings ``eval_start``:
:mod:`~haepo_ray.report.sft_start`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from haepo_ray import names
from haepo_ray.llm.data import jsonl_rows
from haepo_ray.report.stats import auc
from haepo_ray.tracking.queries import run_artifacts

# What judges a completion (label -> its key in a record): the paper's reward against the gold
# summary, its semantic-similarity part (all-MiniLM-L6-v2 cosine to the gold summary), and ROUGE-L
# and ROUGE-2 against the gold summary, which no method optimises (haepo_ray.report.optimised).
JUDGES = {"reward": "reward", "semantic similarity": names.LLM_SEMANTIC_SIMILARITY, "ROUGE-L": names.LLM_ROUGE_L,
          "ROUGE-2": names.LLM_ROUGE_2}

Scores = dict[str, dict[str, float]]  # prompt id -> record key (or its auc_key) -> score
NOT_SCORES = ("update", "seed")  # numbers of a record that are no score


def auc_key(key: str) -> str:
    """``reward`` -> ``reward AUC``: the key of a score's area under a prompt's evaluations."""
    return f"{key} AUC"


def final_scores(lines: Iterable[str], where: str) -> Scores:
    """Prompt id -> score key -> score, per prompt of the last update in ``lines`` (a
    ``generations.jsonl``): each number of its record there (one that other records of the file
    have and it lacks is NaN), and under :func:`auc_key` the area under that number's curve over the prompt's
    updates (:func:`~haepo_ray.report.stats.auc`; NaN with one update); the records of update 0
    (the SFT start's evaluation) are not among them. ``ValueError`` naming ``where`` and the
    line of a record that is no object or lacks its update or prompt id."""
    return evaluation_scores(lines, where)[0]


def evaluation_scores(lines: Iterable[str], where: str) -> tuple[Scores, Scores]:
    """(:func:`final_scores`, the same of the records of update 0: the SFT start's evaluation,
    empty where there is none)."""
    curves: dict[str, dict[int, dict]] = {}
    start: dict[str, dict[int, dict]] = {}
    keys: dict[str, None] = {}  # every score key of the file's records
    for at, record in jsonl_rows(lines, lambda number: f"{where} line {number}"):
        if not isinstance(record, dict) or not {"update", "prompt_id"} <= set(record):
            raise ValueError(f"{at}: expected an object with 'update' and 'prompt_id', got {record!r:.120}")
        (start if record["update"] == 0 else curves).setdefault(record["prompt_id"], {})[record["update"]] = record
        keys |= {k: None for k, v in record.items() if _number(v) and k not in NOT_SCORES}
    return _last_scores(curves, list(keys)), _last_scores(start, list(keys))


def _last_scores(curves: dict[str, dict[int, dict]], keys: list[str]) -> Scores:
    """:func:`final_scores` of the prompts' records by update, NaN for ``keys`` a record lacks."""
    last = max((u for updates in curves.values() for u in updates), default=None)
    out = {}
    for prompt, updates in curves.items():
        if last not in updates:
            continue
        steps = sorted(updates)
        scores = dict.fromkeys(keys, math.nan)
        scores |= {k: float(v) for k, v in updates[last].items() if _number(v) and k not in NOT_SCORES}
        for key in list(scores):
            values = [float(v) if _number(v := updates[u].get(key)) else math.nan for u in steps]
            scores[auc_key(key)] = auc(steps, values)
        out[prompt] = scores
    return out


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_scores(client, run_ids: Iterable[str]) -> Mapping[str, tuple[Scores, Scores]]:
    """Run id -> :func:`evaluation_scores` of its ``generations.jsonl``, for the runs that have one."""
    out = {}
    for run_id, path in run_artifacts(client, run_ids, names.LLM_GENERATIONS):
        with open(path, encoding="utf-8") as f:
            out[run_id] = evaluation_scores(f, f"{names.LLM_GENERATIONS} of run {run_id}")
    return out
