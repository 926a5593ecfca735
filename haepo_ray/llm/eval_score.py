"""Scores of the blinded human evaluation: the forms' keys (``key-seedS.csv``) and the raters'
exported answers -> the paper's table (Table "Human evaluation (mean +- std) on the TL;DR
dataset"), per training seed and pooled over seeds, the alignment rate, and the raters'
comments.

Each answer row goes to the form whose key has its ``form_id``; a row whose form id is none of
the keys' is refused. A rater is one rater id on one form (the paper's participants each
answered one seed's form: "Each seed had 8 participants").

- Rating of a (method, model), the paper's question (a method: an algorithm with its
  configuration, as the key names it, e.g. ``HAEPO (length_normalize=True)``; two
  configurations of one algorithm are two columns): each rater's mean rating of its
  summaries, then the mean and the *sample* standard deviation (ddof 1) of those rater means:
  per seed over the raters of that seed's forms; pooled over all raters of all seeds, each
  rater once (not a mean of seed means), as the paper reports "mean +- 1 std across 40
  participants evaluating summaries generated from five random seeds". With one rater the
  std is undefined: nan.
- Alignment rate, this project's question (the paper's "Metrics & Evaluation" defines it as
  the "fraction of human A/B votes in which the preferred summary matches the original
  poster's TL;DR", but its form shows no such vote): a vote is a rater's one "closest to the
  author's TL;DR" choice on a post (raters do not see that TL;DR); it is aligned when the
  chosen summary has the highest ROUGE-L F1 against the author's TL;DR of that post's
  summaries (key column ``rouge_l``; any of tied best ones counts). Pooled: the aligned votes
  of all forms over all their votes.
- Comments, the paper's open-ended comments: each non-empty one with its seed, post and
  system, for a CSV file (:data:`COMMENT_COLUMNS`), not the table.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from haepo_ray.llm.eval_form import KEY_COLUMNS
from haepo_ray.llm.eval_page import ANSWER_COLUMNS, SCALE, SCALE_TEXT
from haepo_ray.tables import format_table
from haepo_ray.user_paths import read_text

COMMENT_COLUMNS = ("seed", "form_id", "post", "prompt_id", "slot", "method", "algorithm", "model", "rater",
                   "comment")


@dataclass(frozen=True)
class KeyRow:
    post: int
    slot: int
    prompt_id: str
    method: str
    algorithm: str
    model: str
    rouge_l: float


@dataclass(frozen=True)
class Key:
    """One form's key: the file it was read from, its form id, training seed and slots."""

    path: str
    form_id: str
    seed: int
    slots: dict[tuple[int, int], KeyRow]  # (post, slot) -> row


@dataclass(frozen=True)
class Answer:
    form_id: str
    rater: str
    post: int
    slot: int
    rating: int
    closest: bool
    comment: str
    where: str  # "FILE line N", for error messages


@dataclass(frozen=True)
class Cell:
    mean: float
    std: float  # sample std over raters; nan with one rater
    raters: int


@dataclass(frozen=True)
class Scores:
    cells: dict[tuple[str, str], Cell]  # (method, model) -> rating
    aligned: int
    votes: int
    raters: int

    @property
    def alignment_rate(self) -> float:
        return self.aligned / self.votes


@dataclass(frozen=True)
class Report:
    seeds: dict[int, Scores]  # training seed -> the scores of its forms' raters
    pooled: Scores  # over every rater of every seed
    comments: list[dict[str, str]]  # rows of COMMENT_COLUMNS
    unanswered: list[str]  # keys of forms that no answer is to


def _rows(path: str | Path, columns: Sequence[str]) -> Iterable[tuple[str, dict[str, str]]]:
    """``("FILE line N", row)`` of a CSV file with at least ``columns``."""
    reader = csv.DictReader(io.StringIO(read_text(path, "the CSV file", newline=""), newline=""))
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


def read_key(path: str | Path) -> Key:
    """A ``key-seedS.csv`` written by :func:`haepo_ray.llm.eval_form.write_form`: one form id
    and one training seed on every row."""
    first: tuple[str, int] | None = None
    slots: dict[tuple[int, int], KeyRow] = {}
    for where, row in _rows(path, KEY_COLUMNS):
        k = KeyRow(_number(where, row, "post"), _number(where, row, "slot"), row["prompt_id"], row["method"],
                   row["algorithm"], row["model"], _number(where, row, "rouge_l", float))
        form = row["form_id"], _number(where, row, "seed")
        first = first or form
        if (k.post, k.slot) in slots:
            raise ValueError(f"{where}: post {k.post} slot {k.slot} appears twice")
        if form[0] != first[0]:
            raise ValueError(f"{where}: form_id {form[0]} differs from the first row's {first[0]}")
        if form[1] != first[1]:
            raise ValueError(f"{where}: seed {form[1]} differs from the first row's {first[1]} "
                             f"(a form's summaries come from one training seed)")
        slots[k.post, k.slot] = k
    if first is None:
        raise ValueError(f"{path}: the key has no rows")
    return Key(str(path), first[0], first[1], slots)


def read_answers(paths: Iterable[str | Path]) -> list[Answer]:
    """The rows of the answers CSVs that the forms export."""
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
                                  _number(where, row, "slot"), rating, bool(closest),
                                  row["comment"].strip(), where))
    return answers


def score(keys: Sequence[Key], answers: Sequence[Answer]) -> Report:
    """Ratings per (method, model) and alignment rates per training seed and pooled, and the
    comments; ``ValueError`` naming the file and line of an answer that fits no key."""
    forms: dict[str, Key] = {}
    for key in keys:
        if key.form_id in forms:
            raise ValueError(f"{key.path}: form_id {key.form_id} is also the one of {forms[key.form_id].path} "
                             f"(the same form's key given twice?)")
        forms[key.form_id] = key
    if not answers:
        raise ValueError("no answers to score")
    seen: dict[tuple[str, str, int, int], str] = {}
    per_post: dict[tuple[str, str, int], list[Answer]] = defaultdict(list)  # (form, rater, post)
    ratings: dict[tuple[str, str], dict[tuple[str, str], list[int]]] = defaultdict(lambda: defaultdict(list))
    comments = []
    for a in answers:
        key = forms.get(a.form_id)
        if key is None:
            known = ", ".join(f"{k.form_id} ({k.path})" for k in keys)
            raise ValueError(f"{a.where}: form_id {a.form_id} matches none of the keys given: {known} "
                             f"(answers to another form? give its key too)")
        k = key.slots.get((a.post, a.slot))
        if k is None:
            raise ValueError(f"{a.where}: post {a.post} slot {a.slot} is not in the key {key.path}")
        if (a.form_id, a.rater, a.post, a.slot) in seen:
            raise ValueError(f"{a.where}: rater {a.rater!r} answered post {a.post} slot {a.slot} of form "
                             f"{a.form_id} already ({seen[a.form_id, a.rater, a.post, a.slot]})")
        seen[a.form_id, a.rater, a.post, a.slot] = a.where
        per_post[a.form_id, a.rater, a.post].append(a)
        ratings[k.method, k.model][a.form_id, a.rater].append(a.rating)
        if a.comment:
            comments.append({"seed": str(key.seed), "form_id": a.form_id, "post": str(a.post),
                             "prompt_id": k.prompt_id, "slot": str(a.slot), "method": k.method,
                             "algorithm": k.algorithm, "model": k.model, "rater": a.rater, "comment": a.comment})
    aligned: dict[tuple[str, str, int], bool] = {}
    for (form_id, rater, post), rows in per_post.items():
        chosen = [a for a in rows if a.closest]
        if len(chosen) != 1:
            raise ValueError(f"{rows[0].where}: rater {rater!r} chose {len(chosen)} summaries of post "
                             f"{post} as closest to the author's TL;DR; exactly one is needed")
        slots = forms[form_id].slots
        best = max(k.rouge_l for (p, _), k in slots.items() if p == post)
        aligned[form_id, rater, post] = slots[post, chosen[0].slot].rouge_l == best
    means = {system: {rater: statistics.fmean(r) for rater, r in by_rater.items()}
             for system, by_rater in ratings.items()}

    def scores(form_ids: set[str]) -> Scores:
        cells = {}
        for system, by_rater in means.items():
            values = [m for (form_id, _), m in by_rater.items() if form_id in form_ids]
            if values:
                std = statistics.stdev(values) if len(values) > 1 else math.nan
                cells[system] = Cell(statistics.fmean(values), std, len(values))
        votes = [ok for (form_id, _, _), ok in aligned.items() if form_id in form_ids]
        raters = {(form_id, rater) for form_id, rater, _ in aligned if form_id in form_ids}
        return Scores(cells, sum(votes), len(votes), len(raters))

    answered = {form_id for form_id, _, _ in aligned}
    seeds = sorted({forms[form_id].seed for form_id in answered})
    comments.sort(key=lambda c: (int(c["seed"]), c["form_id"], int(c["post"]), int(c["slot"]), c["rater"]))
    return Report({s: scores({f for f in answered if forms[f].seed == s}) for s in seeds},
                  scores(answered), comments, [k.path for k in keys if k.form_id not in answered])


def write_comments(report: Report, path: str | Path) -> Path:
    """Write the report's comments, :data:`COMMENT_COLUMNS`, to the CSV file ``path`` (its
    folder made if need be)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, COMMENT_COLUMNS)
        writer.writeheader()
        writer.writerows(report.comments)
    return path


def format_report(report: Report) -> str:
    """Per training seed and pooled: the paper's table (rows model, columns method, mean +-
    std) and the alignment rate; then what each number is and whose question it is."""
    seeds = ", ".join(map(str, report.seeds))
    blocks = [_block(f"seed {s}", scores) for s, scores in report.seeds.items()]
    blocks.append(_block(f"pooled over seeds {seeds}", report.pooled))
    notes = [
        f"rating 1-5 ({SCALE_TEXT}), the paper's question: each rater's mean rating of a method's "
        f"summaries, then mean ± sample std of those across raters (per seed: that seed's raters; "
        f"pooled: all raters of all seeds, each once); a rater is one rater id on one form",
        "alignment rate, added by this project (the paper's form has no such question): the fraction "
        "of the raters' \"closest to the author's TL;DR\" votes that chose the summary with the "
        "highest ROUGE-L F1 against the author's TL;DR (pooled: all votes of all seeds)",
    ]
    if report.unanswered:
        notes.append(f"no answers to the forms of: {', '.join(report.unanswered)}")
    return "\n\n".join(blocks) + "\n\n" + "\n".join(notes)


def _block(title: str, scores: Scores) -> str:
    methods = sorted({a for a, _ in scores.cells})
    models = sorted({m for _, m in scores.cells})
    rows = [[model, *(_cell(scores.cells.get((a, model))) for a in methods)] for model in models]
    return "\n".join([
        f"{title} ({scores.raters} raters)",
        format_table(["Model", *methods], rows),
        f"alignment rate: {scores.alignment_rate:.3f} ({scores.aligned} of {scores.votes} votes)",
    ])


def _cell(cell: Cell | None) -> str:
    if cell is None:
        return "-"
    return f"{cell.mean:.2f} ± " + ("n/a" if math.isnan(cell.std) else f"{cell.std:.2f}")
