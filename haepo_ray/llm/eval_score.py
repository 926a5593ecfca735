"""Scores of the blinded human evaluation: ``key.csv`` and the raters' exported answers ->
the paper's table (Table "Human evaluation ... on the TL;DR dataset") and the alignment rate.

- Rating of an (algorithm, model): each rater's mean rating of its summaries, then the mean
  and the *sample* standard deviation (ddof 1) of those over raters, as the paper reports
  "mean +- 1 std across participants" (with one rater the std is undefined: nan).
- Alignment rate (paper, "Metrics & Evaluation": "fraction of human A/B votes in which the
  preferred summary matches the original poster's TL;DR"): a vote is a rater's one
  "closest to the author's TL;DR" choice on a post (raters do not see that TL;DR); it is
  aligned when the chosen summary has the highest ROUGE-L F1 against the author's TL;DR of
  that post's summaries (key column ``rouge_l``; any of tied best ones counts).
"""

from __future__ import annotations

import csv
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from haepo_ray.llm.eval_form import KEY_COLUMNS
from haepo_ray.llm.eval_page import ANSWER_COLUMNS, SCALE, SCALE_TEXT
from haepo_ray.tables import format_table


@dataclass(frozen=True)
class KeyRow:
    form_id: str
    post: int
    slot: int
    algorithm: str
    model: str
    run_id: str
    rouge_l: float


@dataclass(frozen=True)
class Answer:
    form_id: str
    rater: str
    post: int
    slot: int
    rating: int
    closest: bool
    where: str  # "FILE line N", for error messages


@dataclass(frozen=True)
class Cell:
    mean: float
    std: float  # sample std over raters; nan with one rater
    raters: int


@dataclass(frozen=True)
class Scores:
    cells: dict[tuple[str, str], Cell]  # (algorithm, model) -> rating
    aligned: int
    votes: int
    raters: int

    @property
    def alignment_rate(self) -> float:
        return self.aligned / self.votes


def _rows(path: str | Path, columns: Sequence[str]) -> Iterable[tuple[str, dict[str, str]]]:
    """``("FILE line N", row)`` of a CSV file with at least ``columns``."""
    try:
        file = open(path, newline="", encoding="utf-8")
    except OSError as err:
        raise ValueError(f"cannot read {path}: {err.strerror or err}") from None
    with file:
        reader = csv.DictReader(file)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path} line 1: columns {missing} are missing (expected {list(columns)})")
        for row in reader:
            where = f"{path} line {reader.line_num}"
            if None in row or any(row[c] is None for c in columns):
                raise ValueError(f"{where}: expected {len(reader.fieldnames)} fields, got a different number")
            yield where, row


def _number(where: str, row: dict[str, str], column: str, kind: type = int):
    try:
        return kind(row[column])
    except ValueError:
        raise ValueError(f"{where}: {column} must be {'an integer' if kind is int else 'a number'}, "
                         f"got {row[column]!r}") from None


def read_key(path: str | Path) -> list[KeyRow]:
    """The rows of a ``key.csv`` written by :func:`haepo_ray.llm.eval_form.write_form`."""
    key, seen = [], set()
    for where, row in _rows(path, KEY_COLUMNS):
        k = KeyRow(row["form_id"], _number(where, row, "post"), _number(where, row, "slot"),
                   row["algorithm"], row["model"], row["run_id"], _number(where, row, "rouge_l", float))
        if (k.post, k.slot) in seen:
            raise ValueError(f"{where}: post {k.post} slot {k.slot} appears twice")
        if key and k.form_id != key[0].form_id:
            raise ValueError(f"{where}: form_id {k.form_id} differs from the first row's {key[0].form_id}")
        seen.add((k.post, k.slot))
        key.append(k)
    if not key:
        raise ValueError(f"{path}: the key has no rows")
    return key


def read_answers(paths: Iterable[str | Path]) -> list[Answer]:
    """The rows of the answers CSVs that ``form.html`` exports."""
    answers = []
    for path in paths:
        for where, row in _rows(path, ANSWER_COLUMNS):
            rating, closest = _number(where, row, "rating"), _number(where, row, "closest")
            if rating not in SCALE:
                raise ValueError(f"{where}: rating must be 1-5 ({SCALE_TEXT}), got {rating}")
            if closest not in (0, 1):
                raise ValueError(f"{where}: closest must be 0 or 1, got {closest}")
            if not row["rater"].strip():
                raise ValueError(f"{where}: the rater id is empty")
            answers.append(Answer(row["form_id"], row["rater"].strip(), _number(where, row, "post"),
                                  _number(where, row, "slot"), rating, bool(closest), where))
    return answers


def score(key: Sequence[KeyRow], answers: Sequence[Answer]) -> Scores:
    """Ratings per (algorithm, model) and the alignment rate; ``ValueError`` naming the file
    and line of an answer that does not fit the key."""
    slots = {(k.post, k.slot): k for k in key}
    form_id = key[0].form_id
    seen: dict[tuple[str, int, int], str] = {}
    per_post: dict[tuple[str, int], list[Answer]] = defaultdict(list)
    ratings: dict[tuple[str, str], dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for a in answers:
        if a.form_id != form_id:
            raise ValueError(f"{a.where}: form_id {a.form_id} is not this key's {form_id} "
                             f"(answers to another form?)")
        if (a.post, a.slot) not in slots:
            raise ValueError(f"{a.where}: post {a.post} slot {a.slot} is not in the key")
        if (a.rater, a.post, a.slot) in seen:
            raise ValueError(f"{a.where}: rater {a.rater!r} answered post {a.post} slot {a.slot} "
                             f"already ({seen[a.rater, a.post, a.slot]})")
        seen[a.rater, a.post, a.slot] = a.where
        per_post[a.rater, a.post].append(a)
        k = slots[a.post, a.slot]
        ratings[k.algorithm, k.model][a.rater].append(a.rating)
    if not answers:
        raise ValueError("no answers to score")
    best = defaultdict(lambda: -math.inf)
    for k in key:
        best[k.post] = max(best[k.post], k.rouge_l)
    aligned = 0
    for (rater, post), rows in per_post.items():
        chosen = [a for a in rows if a.closest]
        if len(chosen) != 1:
            raise ValueError(f"{rows[0].where}: rater {rater!r} chose {len(chosen)} summaries of post "
                             f"{post} as closest to the author's TL;DR; exactly one is needed")
        aligned += slots[post, chosen[0].slot].rouge_l == best[post]
    cells = {}
    for system, by_rater in ratings.items():
        means = [statistics.fmean(r) for r in by_rater.values()]
        std = statistics.stdev(means) if len(means) > 1 else math.nan
        cells[system] = Cell(statistics.fmean(means), std, len(means))
    return Scores(cells, aligned, len(per_post), len({a.rater for a in answers}))


def format_scores(scores: Scores) -> str:
    """The paper's table (rows model, columns algorithm, mean +- std) and the alignment rate."""
    algorithms = sorted({a for a, _ in scores.cells})
    models = sorted({m for _, m in scores.cells})
    rows = [[model, *(_cell(scores.cells.get((a, model))) for a in algorithms)] for model in models]
    return "\n".join([
        format_table(["Model", *algorithms], rows),
        "",
        f"rating 1-5 ({SCALE_TEXT}): mean ± sample std "
        f"over {scores.raters} raters of each rater's mean",
        f"alignment rate: {scores.alignment_rate:.3f} ({scores.aligned} of {scores.votes} votes chose "
        f"the summary closest to the author's TL;DR by ROUGE-L)",
    ])


def _cell(cell: Cell | None) -> str:
    if cell is None:
        return "-"
    return f"{cell.mean:.2f} ± " + ("n/a" if math.isnan(cell.std) else f"{cell.std:.2f}")
