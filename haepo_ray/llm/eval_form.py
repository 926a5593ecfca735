"""The blinded human-evaluation forms (paper, appendix "Human Evaluation Form"): one form per
training seed, as the paper ran it ("the exact questionnaire of a seed ... Each seed had 8
participants").

Input: the generations that ``haepo llm train --out DIR`` writes to ``DIR/generations.jsonl``,
one JSON object per completion ``{"update", "prompt_id", "source", "reference", "instruction",
"shown_source", "completion", "reward", "algorithm", "model", "seed"}`` (:data:`FIELDS`),
from files or from the trial runs of an MLflow experiment (artifact ``generations.jsonl``).

A *method* is an algorithm with its configuration, named as the report names it
(:func:`~haepo_ray.report.runs.method_name`: ``HAEPO (length_normalize=True)``): from MLflow,
the trial run's search values but the seed; from a file, the record's optional ``method`` or
else its algorithm. Output, in one folder, per training seed ``S``:

- ``form-seedS.html`` (:mod:`haepo_ray.llm.eval_page`): one page per post, showing what the
  models were given (the instruction and the source as cut for them, not the whole source)
  and its summaries by slot number only; nothing in it names a method, model, run or seed.
- ``key-seedS.csv``: one row per post x slot, :data:`KEY_COLUMNS`; ``rouge_l`` is the
  summary's ROUGE-L F1 against the author's TL;DR, which decides the alignment rate
  (:mod:`haepo_ray.llm.eval_score`). Keep it away from the raters. A key of another form is
  never replaced (:func:`write_forms`).

Selection, from ``--seed``: per form (training seed) and (method, model) one run of that seed
(a random one when several runs of one method share it); per run and prompt the completion of
its last update; ``posts`` random prompts that every chosen run of every form has, the same
posts on every form; per form and post the slots shuffled. Every form has every (method,
model) that any of the forms has.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import random
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from haepo_ray.llm.data import jsonl_rows
from haepo_ray.llm.rewards import rouge_l
from haepo_ray.names import LLM_GENERATIONS, PARENT_RUN, ROLE
from haepo_ray.user_paths import read_text

GENERATIONS = LLM_GENERATIONS
KEY_COLUMNS = ("form_id", "post", "slot", "prompt_id", "method", "algorithm", "model", "run_id", "seed",
               "update", "rouge_l")
# Keys of a generations.jsonl object and their JSON types (bool is no int here); "method" may be
# there too (a string).
FIELDS = {"update": int, "prompt_id": str, "source": str, "reference": str, "instruction": str,
          "shown_source": str, "completion": str, "reward": (int, float), "algorithm": str, "model": str,
          "seed": int}


@dataclass(frozen=True)
class Generation:
    """One completion of one run (``run_id``: the MLflow run, or the file it was read from)."""

    run_id: str
    update: int
    prompt_id: str
    source: str
    reference: str
    instruction: str  # what the model was asked
    shown_source: str  # the source as the model saw it (cut to max_source_words)
    completion: str
    algorithm: str
    model: str
    seed: int
    method: str  # the algorithm with its configuration (module docstring)

    @property
    def system(self) -> tuple[str, str]:
        return self.method, self.model


@dataclass(frozen=True)
class Post:
    """A page of the form: the post and its summaries in slot order (slot = index + 1)."""

    prompt_id: str
    source: str
    reference: str
    instruction: str
    shown_source: str
    slots: tuple[Generation, ...]


def read_generations(path: str | Path, run_id: str | None = None, config_label: str | None = None) -> list[Generation]:
    """The records of one ``generations.jsonl`` (of MLflow run ``run_id``, else of the run
    named by its path), their method the algorithm with ``config_label`` (that run's), else the
    record's ``method``, else its algorithm; ``ValueError`` naming file or run, line and key."""
    from haepo_ray.report.runs import method_name

    path = Path(path)
    lines = read_text(path, "generations file").splitlines()
    name = f"{GENERATIONS} of run {run_id}" if run_id else str(path)
    records = []
    for where, obj in jsonl_rows(lines, lambda number: f"{name} line {number}"):
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        for key, kind in FIELDS.items():
            if key not in obj:
                raise ValueError(f"{where}: key {key!r} is missing (a record has {sorted(FIELDS)})")
            if isinstance(obj[key], bool) or not isinstance(obj[key], kind):
                raise ValueError(f"{where}: {key!r} must be {_kind_name(kind)}, got {obj[key]!r}")
        if not isinstance(obj.get("method", ""), str):
            raise ValueError(f"{where}: 'method' must be a string, got {obj['method']!r}")
        method = method_name(obj["algorithm"], config_label) if config_label else obj.get("method", obj["algorithm"])
        records.append(Generation(run_id=run_id or str(path), method=method, **{
            k: obj[k] for k in FIELDS if k != "reward"}))
    return records


def _kind_name(kind) -> str:
    return "a number" if isinstance(kind, tuple) else {int: "an integer", str: "a string"}[kind]


def generations_from_mlflow(experiment: str, tracking_uri: str) -> list[Generation]:
    """The records of every trial run (tag ``haepo.role`` = ``trial``, a sweep's child) of
    ``experiment`` that has a ``generations.jsonl`` artifact, each with its run id and its
    method named by the run's configuration (:func:`~haepo_ray.report.runs.run_config_label`).

    ``LookupError`` when the store, the experiment or any generations are missing."""
    from haepo_ray.report.runs import run_config_label
    from haepo_ray.tracking import experiment_named, open_store, search_all_runs
    from haepo_ray.tracking.queries import run_artifacts

    client = open_store(tracking_uri)
    exp = experiment_named(client, experiment)
    runs = [r for r in search_all_runs(client, exp.experiment_id, f"tags.`{ROLE}` = 'trial'")
            if PARENT_RUN in r.data.tags]
    labels = {run.info.run_id: run_config_label(run) for run in runs}
    records: list[Generation] = []
    for run_id, path in run_artifacts(client, labels, GENERATIONS):
        records += read_generations(path, run_id, labels[run_id])
    if not records:
        raise LookupError(f"MLflow experiment {experiment!r} at {tracking_uri} has no generations: "
                          f"none of its {len(runs)} trial runs has a {GENERATIONS} artifact "
                          f"with records (run LLM specs with `haepo sweep`)")
    return records


def pick_forms(records: Iterable[Generation], posts: int, seed: int,
               seeds: Sequence[int] | None = None) -> dict[int, list[Post]]:
    """Training seed -> its form's ``posts`` pages, each with one summary per (method, model)
    of that seed in shuffled slots; a form per seed of the records, or per ``seeds``."""
    if posts < 1:
        raise ValueError(f"--posts must be at least 1, got {posts}")
    latest = _latest_per_run(records)
    if not latest:
        raise LookupError("no generations to build a form from")
    runs: dict[int, dict[tuple[str, str], list[str]]] = defaultdict(lambda: defaultdict(list))
    for run_id, completions in sorted(latest.items()):
        first = next(iter(completions.values()))
        runs[first.seed][first.system].append(run_id)
    seeds = sorted(runs if seeds is None else set(seeds))
    missing = [s for s in seeds if s not in runs]
    if missing:
        raise LookupError(f"no run has training seed {', '.join(map(str, missing))} "
                          f"(the runs have seeds {', '.join(map(str, sorted(runs)))})")
    systems = sorted({system for s in seeds for system in runs[s]})
    for s in seeds:
        lacking = [system for system in systems if system not in runs[s]]
        if lacking:
            raise LookupError(f"training seed {s} has no run of {_names(lacking)}: every form needs "
                              f"every method and model ({_names(systems)}); pick --seeds that have them all")
    rngs = {s: random.Random(f"{seed}/{s}") for s in seeds}  # a form's choices, whatever the other seeds
    chosen = {s: [rngs[s].choice(runs[s][system]) for system in systems] for s in seeds}
    common = set.intersection(*(set(latest[run_id]) for s in seeds for run_id in chosen[s]))
    if len(common) < posts:
        raise LookupError(f"only {len(common)} prompts have a completion from every method and "
                          f"model ({_names(systems)}) of training seeds {', '.join(map(str, seeds))}; "
                          f"ask for --posts {len(common)} or fewer")
    prompts = random.Random(seed).sample(sorted(common), posts)
    forms: dict[int, list[Post]] = {s: [] for s in seeds}
    for prompt_id in prompts:
        slots = {s: [latest[run_id][prompt_id] for run_id in chosen[s]] for s in seeds}
        first, *others = (g for s in seeds for g in slots[s])
        for other in others:
            if (other.source, other.reference) != (first.source, first.reference):
                raise ValueError(f"prompt {prompt_id!r} has a different source or reference in runs "
                                 f"{first.run_id} and {other.run_id} (generations of different data sets?)")
            if (other.instruction, other.shown_source) != (first.instruction, first.shown_source):
                raise ValueError(f"prompt {prompt_id!r} was put to runs {first.run_id} and {other.run_id} "
                                 f"differently (instruction or source as shown; another max_source_words?): "
                                 f"a form shows its summaries one input")
        for s in seeds:
            rngs[s].shuffle(slots[s])
            forms[s].append(Post(prompt_id, first.source, first.reference, first.instruction, first.shown_source,
                                 tuple(slots[s])))
    return forms


def _names(systems: Iterable[tuple[str, str]]) -> str:
    return ", ".join(f"{a} on {m}" for a, m in systems)


def _latest_per_run(records: Iterable[Generation]) -> dict[str, dict[str, Generation]]:
    """run id -> prompt id -> the completion of the last update that has that prompt."""
    latest: dict[str, dict[str, Generation]] = defaultdict(dict)
    for rec in records:
        runs = latest[rec.run_id]
        first = next(iter(runs.values()), rec)
        if (first.method, first.model, first.seed) != (rec.method, rec.model, rec.seed):
            raise ValueError(f"run {rec.run_id} mixes runs: {first.method}/{first.model}/seed "
                             f"{first.seed} and {rec.method}/{rec.model}/seed {rec.seed}")
        old = runs.get(rec.prompt_id)
        if old is not None and old.update == rec.update:
            raise ValueError(f"run {rec.run_id} has two completions of prompt {rec.prompt_id!r} "
                             f"at update {rec.update}")
        if old is None or rec.update > old.update:
            runs[rec.prompt_id] = rec
    return latest


def key_rows(pages: Sequence[Post]) -> list[dict[str, str]]:
    """The rows of ``key.csv`` (all values as written), ``form_id`` a hash of the rest: the
    form carries it so that answers are never scored against another form's key."""
    rows = [{"post": str(p), "slot": str(s), "prompt_id": g.prompt_id, "method": g.method, "algorithm": g.algorithm,
             "model": g.model, "run_id": g.run_id, "seed": str(g.seed), "update": str(g.update),
             "rouge_l": f"{rouge_l(g.completion, page.reference):.6f}"}
            for p, page in enumerate(pages, 1) for s, g in enumerate(page.slots, 1)]
    form_id = hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]
    return [{"form_id": form_id, **row} for row in rows]


def write_forms(forms: Mapping[int, Sequence[Post]], out_dir: str | Path) -> list[tuple[Path, Path]]:
    """Write every form of ``forms`` (:func:`pick_forms`) as :func:`write_form` does; a
    ValueError, before any is written, where one would replace the key of another form."""
    out = Path(out_dir)
    checked = [(pages, *_check_key(pages, out)) for pages in forms.values()]
    return [_write(pages, out, *key) for pages, *key in checked]


def write_form(pages: Sequence[Post], out_dir: str | Path) -> tuple[Path, Path]:
    """Write the form of one training seed ``S``, ``form-seedS.html`` and ``key-seedS.csv``,
    into ``out_dir``; return their paths. A ValueError, before anything is written, where
    ``out_dir`` holds another key of that seed."""
    out = Path(out_dir)
    return _write(pages, out, *_check_key(pages, out))


def _check_key(pages: Sequence[Post], out: Path) -> tuple[int, str, bytes]:
    """The training seed of ``pages``, their form's id and their key's CSV; a ValueError where
    ``out`` holds another key of that seed: the only record of what the slots of its form,
    which may have been handed out already, hold."""
    seeds = {g.seed for page in pages for g in page.slots}
    if len(seeds) != 1:
        raise ValueError(f"a form's summaries come from one training seed, these from seeds {sorted(seeds)}")
    (seed,) = seeds
    rows = key_rows(pages)
    text = io.StringIO()
    writer = csv.DictWriter(text, KEY_COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    data = text.getvalue().encode("utf-8")
    key = out / f"key-seed{seed}.csv"
    if key.exists() and key.read_bytes() != data:
        raise ValueError(f"{key} is the key of another form of training seed {seed}, which the answers to that "
                         "form need: write these forms to another folder, or move that key away first")
    return seed, rows[0]["form_id"], data


def _write(pages: Sequence[Post], out: Path, seed: int, form_id: str, key_csv: bytes) -> tuple[Path, Path]:
    from haepo_ray.llm.eval_page import render_form

    out.mkdir(parents=True, exist_ok=True)
    form, key = out / f"form-seed{seed}.html", out / f"key-seed{seed}.csv"
    form.write_text(render_form(pages, form_id), encoding="utf-8")
    key.write_bytes(key_csv)
    return form, key
