"""The scores of a language-model trial's held-out greedy completions, per prompt, from its
run's ``generations.jsonl`` artifact (:mod:`haepo_ray.llm.train` writes one record per prompt
and evaluation with the completion's reward and its parts against the gold summary; the
tracking callback logs the file at the run's root): those of the trial's last evaluation, which
the win rates of :mod:`~haepo_ray.report.llm_results` compare, and those of its SFT start's
evaluation (update 0, settings ``eval_start``: :mod:`~haepo_ray.report.sft_start`).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterable, Mapping

from haepo_ray import names
from haepo_ray.llm.data import jsonl_rows
from haepo_ray.llm.eval_form import GENERATIONS, no_progress_bars

# What judges a completion (label -> its key in a record): the paper's reward against the gold
# summary, its semantic-similarity part (all-MiniLM-L6-v2 cosine to the gold summary), and ROUGE-L
# and ROUGE-2 against the gold summary, which no method optimises (haepo_ray.report.optimised).
JUDGES = {"reward": "reward", "semantic similarity": names.LLM_SEMANTIC_SIMILARITY, "ROUGE-L": names.LLM_ROUGE_L,
          "ROUGE-2": names.LLM_ROUGE_2}

Scores = dict[str, dict[str, float]]  # prompt id -> record key of a judge -> score


def final_scores(lines: Iterable[str], where: str) -> Scores:
    """Prompt id -> judge key -> score of the records of the last update in ``lines`` (a
    ``generations.jsonl``); a key a record lacks is NaN. ``ValueError`` naming ``where`` and
    the line of a record that is no object or lacks its update or prompt id."""
    return evaluation_scores(lines, where)[0]


def evaluation_scores(lines: Iterable[str], where: str) -> tuple[Scores, Scores]:
    """(:func:`final_scores`, the same of the records of update 0: the SFT start's evaluation,
    empty where there is none)."""
    records = []
    for at, record in jsonl_rows(lines, lambda number: f"{where} line {number}"):
        if not isinstance(record, dict) or not {"update", "prompt_id"} <= set(record):
            raise ValueError(f"{at}: expected an object with 'update' and 'prompt_id', got {record!r:.120}")
        records.append(record)
    last = max((r["update"] for r in records), default=None)
    return tuple({r["prompt_id"]: {key: float(r.get(key, math.nan)) for key in JUDGES.values()}
                  for r in records if r["update"] == update} for update in (last, 0))


def read_scores(client, run_ids: Iterable[str]) -> Mapping[str, tuple[Scores, Scores]]:
    """Run id -> :func:`evaluation_scores` of its ``generations.jsonl``, for the runs that have one."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp, no_progress_bars():
        for run_id in run_ids:
            if GENERATIONS in {a.path for a in client.list_artifacts(run_id)}:
                path = client.download_artifacts(run_id, GENERATIONS, tmp)
                with open(path, encoding="utf-8") as f:
                    out[run_id] = evaluation_scores(f, f"{GENERATIONS} of run {run_id}")
    return out
