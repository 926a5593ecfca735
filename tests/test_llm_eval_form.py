"""The blinded human-evaluation forms: records (files, a real SQLite MLflow store), one form
per training seed, the seeded choice and shuffle, blinding, the scorer against hand-computed
answers of one form and of forms of two seeds pooled, bad input, and the form filled and
exported in headless Chromium."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import re
import subprocess
import sys
import time
from html import escape
from pathlib import Path

import pytest
from chromium import headless_chromium
from helpers import sqlite_store

from haepo_ray.cli import UsageError
from haepo_ray.cli.llm_eval import add_parsers
from haepo_ray.llm.eval_form import (
    GENERATIONS, generations_from_mlflow, pick_forms, read_generations, rouge_l, write_form)
from haepo_ray.llm.eval_page import ANSWER_COLUMNS, EMPTY_SUMMARY, ORIGIN_NOTE
from haepo_ray.llm.eval_score import format_report, read_answers, read_key, score
from haepo_ray.names import PARENT_RUN, ROLE

ALGORITHMS = ("HAEPO", "GRPO", "DPO")
MODELS = ("llama-3.2-1b", "qwen2.5-1.5b")
SYSTEMS = [(a, m) for a in ALGORITHMS for m in MODELS]
# prompt id -> (post, the author's TL;DR)
PROMPTS = {
    "p0": ("I read two novels but get tired after two pages <b>& lose</b> interest.",
           "getting back into reading but it feels like a chore will it improve"),
    "p1": ("My boyfriend and I had our first fight; I told a friend his secret.",
           "first fight with my boyfriend how do i regain his trust"),
    "p2": ("Our landlord keeps the deposit although the flat was spotless.",
           "landlord refuses to return the deposit what can i do"),
}


INSTRUCTION = "Summarize this post in one sentence."


def _shown(source: str) -> str:
    """The source as the models saw it: all but its last word (as max_source_words cuts)."""
    return " ".join(source.split()[:-1])


def _write_run(path: Path, index: int, algorithm: str, model: str, seed: int, prompts=PROMPTS) -> Path:
    """A run's generations.jsonl: updates 5 and 10; at update 10 system ``index`` answers with
    the first ``index + 2`` words of the TL;DR (so a higher index is closer to it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for update in (5, 10):
            for prompt_id, (source, reference) in prompts.items():
                words = reference.split()[: index + 2]
                text = " ".join(words) if update == 10 else f"draft {index} {seed}"
                f.write(json.dumps({"update": update, "prompt_id": prompt_id, "source": source,
                                    "reference": reference, "instruction": INSTRUCTION,
                                    "shown_source": _shown(source), "completion": text, "reward": 0.5,
                                    "algorithm": algorithm, "model": model, "seed": seed}) + "\n")
    return path


@pytest.fixture
def files(tmp_path) -> list[Path]:
    """One run per (algorithm, model) and training seed 0 or 1 (seed 0's first), and a second
    run of HAEPO on Llama with seed 1 (another setting of that sweep, say) last."""
    runs = [_write_run(tmp_path / f"{a}-{m}-s{s}" / GENERATIONS, i, a, m, s)
            for s in (0, 1) for i, (a, m) in enumerate(SYSTEMS)]
    return runs + [_write_run(tmp_path / f"{ALGORITHMS[0]}-{MODELS[0]}-s1-b" / GENERATIONS, 6, *SYSTEMS[0], 1)]


def _records(files):
    return [r for f in files for r in read_generations(f)]


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="haepo llm")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_one_form_per_training_seed_with_every_system_of_that_seed_in_a_seeded_order(files):
    forms = pick_forms(_records(files), 2, seed=0)
    assert sorted(forms) == [0, 1]
    for training_seed, pages in forms.items():
        assert len(pages) == 2 and len({p.prompt_id for p in pages}) == 2
        for page in pages:
            assert sorted(g.system for g in page.slots) == sorted(SYSTEMS)
            assert {g.seed for g in page.slots} == {training_seed}  # no form mixes seeds
            assert {g.update for g in page.slots} == {10}  # the last update's completions
            assert {(g.source, g.reference) for g in page.slots} == {PROMPTS[page.prompt_id]}
    assert [p.prompt_id for p in forms[0]] == [p.prompt_id for p in forms[1]]  # the same posts
    orders = [[g.system for p in forms[s] for g in p.slots] for s in (0, 1)]
    assert orders[0][:6] != orders[0][6:] and orders[0] != orders[1]  # shuffled per post and form
    assert pick_forms(_records(files), 2, seed=0) == forms
    assert pick_forms(_records(files), 2, seed=0, seeds=[1]) == {1: forms[1]}  # whatever other seeds
    other = pick_forms(_records(files), 2, seed=1)
    assert [[g.system for p in other[s] for g in p.slots] for s in (0, 1)] != orders
    # HAEPO on Llama has two runs of seed 1: --seed picks one of them for seed 1's form.
    chosen = {g.run_id for s in range(8) for p in pick_forms(_records(files), 1, s, [1])[1]
              for g in p.slots if g.system == SYSTEMS[0]}
    assert chosen == {str(files[len(SYSTEMS)]), str(files[-1])}


def test_forms_are_blinded_escaped_and_reproducible(files, tmp_path, capsys):
    out = tmp_path / "form"
    argv = ["eval-form", "--generations", *map(str, files), "--posts", "3", "--seed", "4"]
    assert _run([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["form-seed0.html", "form-seed1.html",
                                                     "key-seed0.csv", "key-seed1.csv"]
    assert f"--key {out / 'key-seed0.csv'} {out / 'key-seed1.csv'} --answers" in printed
    form_ids = set()
    for training_seed in (0, 1):
        html = (out / f"form-seed{training_seed}.html").read_text()
        lowered = html.lower()
        for secret in [*ALGORITHMS, *MODELS, *(str(f) for f in files), *(f.parent.name for f in files)]:
            assert secret.lower() not in lowered, secret
        rows = list(csv.DictReader((out / f"key-seed{training_seed}.csv").open()))
        assert len(rows) == 3 * len(SYSTEMS) and {r["seed"] for r in rows} == {str(training_seed)}
        assert {r["run_id"] for r in rows} <= {str(f) for f in files}
        for _, reference in PROMPTS.values():
            assert reference not in html  # the author's TL;DR decides alignment: never shown
        # What the models were given, the instruction and the source as cut for them; not the rest.
        assert html.count(f"The instruction: <b>{INSTRUCTION}</b>") == 3
        shown = [p for p, (source, _) in PROMPTS.items()
                 if f"<blockquote>{escape(_shown(source))}</blockquote>" in html]
        assert len(shown) == 3 and not any(escape(source) in html for source, _ in PROMPTS.values())
        assert "&lt;b&gt;&amp; lose&lt;/b&gt;" in html and "<b>& lose" not in html
        assert html.count('class="post"') == 3 and html.count('class="summary"') == 3 * len(SYSTEMS)
        assert html.count('<textarea class="comment"') == 3 * len(SYSTEMS)  # a comment per summary
        assert "http" not in html and "src=" not in html  # self-contained
        assert 'data-form="' + rows[0]["form_id"] + '"' in html
        form_ids.add(rows[0]["form_id"])
    assert len(form_ids) == 2  # each form its own key
    assert _run([*argv, "--out", str(tmp_path / "again")]) == 0
    for path in out.iterdir():
        assert (tmp_path / "again" / path.name).read_text() == path.read_text()
    # Into the same folder: the same forms again are written; other forms (another --seed) are
    # refused before any file changes, since a key is the only record of its handed-out form.
    written = {path.name: path.read_bytes() for path in out.iterdir()}
    assert _run([*argv, "--out", str(out)]) == 0
    with pytest.raises(UsageError, match=rf"^{re.escape(str(out / 'key-seed0.csv'))} is the key of another form "
                                         "of training seed 0, which the answers to that form need: write these "
                                         "forms to another folder, or move that key away first$"):
        _run([*argv[:-1], "5", "--out", str(out)])
    (out / "key-seed0.csv").unlink()  # seed 1's key is still there: refused all the same
    with pytest.raises(UsageError, match="key-seed1.csv is the key of another form of training seed 1"):
        _run([*argv[:-1], "5", "--out", str(out)])
    assert {path.name: path.read_bytes() for path in out.iterdir()} == {
        name: data for name, data in written.items() if name != "key-seed0.csv"}
    assert _run([*argv, "--out", str(tmp_path / "one"), "--seeds", "1"]) == 0
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == ["form-seed1.html", "key-seed1.csv"]
    assert (tmp_path / "one" / "key-seed1.csv").read_text() == (out / "key-seed1.csv").read_text()


def test_the_page_says_which_questions_are_the_papers(files, tmp_path):
    form, _ = write_form(pick_forms(_records(files), 2, seed=0)[0], tmp_path)
    html = form.read_text()
    assert f'<p class="origin">About the questions: {escape(ORIGIN_NOTE)}</p>' in html
    assert "1-5 rating and the comments are the questions of the paper" in ORIGIN_NOTE
    assert "closest to the author's TL;DR was added by this project" in ORIGIN_NOTE
    summaries = 2 * len(SYSTEMS)
    assert html.count('<div class="scale" data-origin="paper">') == summaries
    assert html.count('<label class="comment" data-origin="paper">') == summaries
    assert html.count('<label class="closest" data-origin="project">') == summaries


def test_rouge_l_is_the_lcs_f_measure():
    # LCS("a b c d", "a c x d") = a c d: P = 3/4, R = 3/4.
    assert rouge_l("A b, c d!", "a c x d") == pytest.approx(0.75)
    assert rouge_l("", "a") == rouge_l("x y", "a b") == 0.0


# Hand-computed: key of 2 posts x 3 slots (form f1, training seed 0), answers of raters a and
# b (a.csv) and c (c.csv). Key rows: (post, slot, algorithm, model, ROUGE-L).
KEY = [(1, 1, "DPO", "m1", 0.2), (1, 2, "HAEPO", "m1", 0.5), (1, 3, "HAEPO", "m2", 0.5),
       (2, 1, "HAEPO", "m2", 0.1), (2, 2, "HAEPO", "m1", 0.3), (2, 3, "DPO", "m1", 0.4)]
# rater -> post -> (ratings of slots 1-3, the slot chosen as closest)
ANSWERS = {"a": {1: ((2, 5, 4), 3), 2: ((3, 4, 3), 2)},
           "b": {1: ((1, 4, 4), 1), 2: ((2, 5, 2), 3)},
           "c": {1: ((3, 3, 5), 2)}}


def _write_answers(path: Path, raters: list[str], form_id: str = "f1", answers=ANSWERS,
                   comments: dict | None = None) -> Path:
    """Answers as the form exports them; ``comments``: (rater, post, slot) -> text."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(ANSWER_COLUMNS)
        for rater in raters:
            for post, (ratings, chosen) in answers[rater].items():
                for slot, rating in enumerate(ratings, 1):
                    writer.writerow([form_id, rater, post, slot, rating, int(slot == chosen),
                                     (comments or {}).get((rater, post, slot), "")])
    return path


def _write_key(path: Path, form_id: str = "f1", seed: int = 0, rows=KEY) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["form_id", "post", "slot", "prompt_id", "method", "algorithm", "model", "run_id",
                         "seed", "update", "rouge_l"])
        for post, slot, method, model, rouge in rows:
            writer.writerow([form_id, post, slot, f"q{post}", method, method.split(" (")[0], model,
                             f"run-{method}-{model}", seed, 10, rouge])
    return path


def test_scores_match_hand_computed_answers(tmp_path, capsys):
    key = _write_key(tmp_path / "key.csv")
    answers = [_write_answers(tmp_path / "a.csv", ["a", "b"]), _write_answers(tmp_path / "c.csv", ["c"])]
    report = score([read_key(key)], read_answers(answers))
    assert list(report.seeds) == [0] and report.pooled == report.seeds[0]
    scores = report.pooled
    # Rater means: HAEPO/m1 a (5+4)/2, b (4+5)/2, c 3; DPO/m1 2.5, 1.5, 3; HAEPO/m2 3.5, 3, 5.
    haepo_m1, dpo_m1, haepo_m2 = (scores.cells[s] for s in [("HAEPO", "m1"), ("DPO", "m1"), ("HAEPO", "m2")])
    assert (haepo_m1.mean, haepo_m1.std, haepo_m1.raters) == (pytest.approx(4.0), pytest.approx(math.sqrt(9 / 12)), 3)
    assert (dpo_m1.mean, dpo_m1.std) == (pytest.approx(7 / 3), pytest.approx(math.sqrt(7 / 12)))
    assert (haepo_m2.mean, haepo_m2.std) == (pytest.approx(23 / 6), pytest.approx(math.sqrt(13 / 12)))
    assert ("DPO", "m2") not in scores.cells
    # Votes: a/1 slot 3 (tied best), a/2 slot 2 (no), b/1 slot 1 (no), b/2 slot 3 (best), c/1 slot 2 (tied best).
    assert (scores.aligned, scores.votes, scores.raters) == (3, 5, 3)
    comments = tmp_path / "scores" / "comments.csv"  # its folder is made
    assert _run(["eval-score", "--key", str(key), "--answers", *map(str, answers), "--comments", str(comments)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "seed 0 (3 raters)" and lines[1].split() == ["Model", "DPO", "HAEPO"]
    assert lines[3].split() == ["m1", "2.33", "±", "0.76", "4.00", "±", "0.87"]
    assert lines[4].split() == ["m2", "-", "3.83", "±", "1.04"]
    assert lines[5] == "alignment rate: 0.600 (3 of 5 votes)"
    assert f"0 comments (the paper's open-ended comments) written to {comments}" in out
    assert comments.read_text().splitlines() == [",".join(COMMENT_HEADER)]
    one = score([read_key(key)], read_answers(answers[1:]))
    assert math.isnan(one.pooled.cells["HAEPO", "m1"].std) and "3.00 ± n/a" in format_report(one)


COMMENT_HEADER = ["seed", "form_id", "post", "prompt_id", "slot", "method", "algorithm", "model", "rater", "comment"]
# Two forms, training seeds 0 (form g0) and 1 (g1), each of 2 posts x 2 slots, HAEPO and DPO on m1.
POOL_KEYS = {"g0": (0, [(1, 1, "HAEPO", "m1", 0.5), (1, 2, "DPO", "m1", 0.2),
                        (2, 1, "DPO", "m1", 0.4), (2, 2, "HAEPO", "m1", 0.3)]),
             "g1": (1, [(1, 1, "DPO", "m1", 0.1), (1, 2, "HAEPO", "m1", 0.6),
                        (2, 1, "HAEPO", "m1", 0.7), (2, 2, "DPO", "m1", 0.2)])}
# rater -> (form, post -> (ratings of slots 1-2, the slot chosen as closest)); two raters a form.
POOL_ANSWERS = {"a": ("g0", {1: ((5, 2), 1), 2: ((3, 4), 2)}),  # HAEPO 5, 4; DPO 2, 3
                "b": ("g0", {1: ((3, 4), 2), 2: ((4, 4), 1)}),  # HAEPO 3, 4; DPO 4, 4
                "c": ("g1", {1: ((1, 5), 2), 2: ((5, 2), 1)}),  # HAEPO 5, 5; DPO 1, 2
                "d": ("g1", {1: ((3, 4), 1), 2: ((3, 2), 1)})}  # HAEPO 4, 3; DPO 3, 2


def test_answers_to_the_forms_of_two_seeds_are_scored_per_seed_and_pooled(tmp_path, capsys):
    keys = [_write_key(tmp_path / f"key-seed{seed}.csv", form_id, seed, rows)
            for form_id, (seed, rows) in POOL_KEYS.items()]
    comments = {("a", 1, 2): 'too long, "dramatic"\nbut detailed', ("c", 2, 1): "concise"}
    answers = {rater: _write_answers(tmp_path / f"answers-{rater}.csv", [rater], form_id,
                                     {rater: posts}, comments)
               for rater, (form_id, posts) in POOL_ANSWERS.items()}
    files = [answers[r] for r in "dacb"]  # any order: each file goes to its form by its form id
    report = score([read_key(k) for k in keys], read_answers(files))
    # Rater means. Seed 0: HAEPO a 4.5, b 3.5; DPO a 2.5, b 4. Seed 1: HAEPO c 5, d 3.5; DPO c 1.5, d 2.5.
    want = {0: {"HAEPO": (4.0, math.sqrt(0.5)), "DPO": (3.25, math.sqrt(1.125))},
            1: {"HAEPO": (4.25, math.sqrt(1.125)), "DPO": (2.0, math.sqrt(0.5))}}
    for seed, cells in want.items():
        for algorithm, (mean, std) in cells.items():
            cell = report.seeds[seed].cells[algorithm, "m1"]
            assert (cell.mean, cell.std, cell.raters) == (pytest.approx(mean), pytest.approx(std), 2)
    # Pooled: mean and sample std of the 4 raters' means (not of the 2 seed means): HAEPO 4.5,
    # 3.5, 5, 3.5: 4.125, squares 0.140625 + 0.390625 + 0.765625 + 0.390625 = 1.6875, / 3 ->
    # std 0.75; DPO 2.5, 4, 1.5, 2.5: 2.625, squares 0.015625 + 1.890625 + 1.265625 + 0.015625
    # = 3.1875, / 3 -> std sqrt(1.0625).
    haepo, dpo = report.pooled.cells["HAEPO", "m1"], report.pooled.cells["DPO", "m1"]
    assert (haepo.mean, haepo.std, haepo.raters) == (pytest.approx(4.125), pytest.approx(0.75), 4)
    assert (dpo.mean, dpo.std, dpo.raters) == (pytest.approx(2.625), pytest.approx(math.sqrt(1.0625)), 4)
    # Votes: a 1/1 yes, a 2/2 no, b 1/2 no, b 2/1 yes; c 1/2 yes, c 2/1 yes, d 1/1 no, d 2/1 yes.
    assert [(s.aligned, s.votes, s.raters) for s in report.seeds.values()] == [(2, 4, 2), (3, 4, 2)]
    assert (report.pooled.aligned, report.pooled.votes, report.pooled.raters) == (5, 8, 4)

    written = tmp_path / "out" / "comments.csv"
    (tmp_path / "out").mkdir()
    assert _run(["eval-score", "--key", *map(str, keys), "--answers", *map(str, files),
                 "--comments", str(written)]) == 0
    out = capsys.readouterr().out
    blocks = out.split("\n\n")
    assert blocks[0].splitlines()[0] == "seed 0 (2 raters)"
    assert blocks[0].splitlines()[3].split() == ["m1", "3.25", "±", "1.06", "4.00", "±", "0.71"]
    assert blocks[0].splitlines()[4] == "alignment rate: 0.500 (2 of 4 votes)"
    assert blocks[1].splitlines()[0] == "seed 1 (2 raters)"
    assert blocks[1].splitlines()[3].split() == ["m1", "2.00", "±", "0.71", "4.25", "±", "1.06"]
    assert blocks[1].splitlines()[4] == "alignment rate: 0.750 (3 of 4 votes)"
    assert blocks[2].splitlines()[0] == "pooled over seeds 0, 1 (4 raters)"
    assert blocks[2].splitlines()[3].split() == ["m1", "2.62", "±", "1.03", "4.12", "±", "0.75"]
    assert blocks[2].splitlines()[4] == "alignment rate: 0.625 (5 of 8 votes)"
    assert "the paper's question: each rater's mean rating" in blocks[3]
    assert "pooled: all raters of all seeds, each once" in blocks[3]
    assert "alignment rate, added by this project (the paper's form has no such question)" in blocks[3]
    assert "2 comments (the paper's open-ended comments) written to" in blocks[3]
    with written.open(newline="") as f:
        assert list(csv.reader(f)) == [
            COMMENT_HEADER, ["0", "g0", "1", "q1", "2", "DPO", "DPO", "m1", "a", 'too long, "dramatic"\nbut detailed'],
            ["1", "g1", "2", "q2", "1", "HAEPO", "HAEPO", "m1", "c", "concise"]]


def test_answers_to_a_form_of_none_of_the_keys_are_refused_naming_the_file(tmp_path):
    keys = {form_id: _write_key(tmp_path / f"key-seed{seed}.csv", form_id, seed, rows)
            for form_id, (seed, rows) in POOL_KEYS.items()}
    answers = {rater: _write_answers(tmp_path / f"answers-{rater}.csv", [rater], form_id, {rater: posts})
               for rater, (form_id, posts) in POOL_ANSWERS.items()}
    stray = _write_answers(tmp_path / "answers-e.csv", ["a"], "g9", {"a": POOL_ANSWERS["a"][1]})

    def error(keys, answers) -> str:
        with pytest.raises(UsageError) as err:
            _run(["eval-score", "--key", *map(str, keys), "--answers", *map(str, answers),
                  "--comments", str(tmp_path / "comments.csv")])
        return str(err.value)

    assert error(keys.values(), [*answers.values(), stray]) == (
        f"{stray} line 2: form_id g9 matches none of the keys given: g0 ({keys['g0']}), g1 ({keys['g1']}) "
        f"(answers to another form? give its key too)")
    assert error([keys["g0"]], [answers["a"], answers["c"]]).startswith(
        f"{answers['c']} line 2: form_id g1 matches none of the keys given: g0 ({keys['g0']})")
    assert f"{keys['g0']}: form_id g0 is also the one of {keys['g0']}" in error(
        [keys["g0"], keys["g0"]], [answers["a"]])
    assert not (tmp_path / "comments.csv").exists()


@pytest.mark.parametrize("edit, message", [
    (lambda lines: lines[:3] + ["f1,a,1,3,4,0"] + lines[4:], "a.csv line 4: expected 7 fields"),
    (lambda lines: [lines[0].replace("rating", "score")] + lines[1:], "a.csv line 1: columns ['rating'] are missing"),
    (lambda lines: [lines[0].replace(",comment", "")] + [line[:-1] for line in lines[1:]],
     "a.csv line 1: columns ['comment'] are missing"),
    (lambda lines: lines + ["f1,d,3,1,4,1,"], "a.csv line 14: post 3 slot 1 is not in the key"),
    (lambda lines: lines[:1] + ["f1,a,1,1,6,0,"] + lines[2:], "a.csv line 2: rating must be 1-5 (1 Poor, 2 Fair"),
    (lambda lines: lines[:1] + ["f1,a,1,1,x,0,"] + lines[2:], "a.csv line 2: rating must be an integer, got 'x'"),
    (lambda lines: lines[:1] + ["f1,a,1,1,2,2,"] + lines[2:], "a.csv line 2: closest must be 0 or 1"),
    (lambda lines: lines[:1] + ["f1, ,1,1,2,0,"] + lines[2:], "a.csv line 2: the rater id is empty"),
    (lambda lines: lines[:1] + ["f1,a,1,1,2,1,"] + lines[2:], "rater 'a' chose 2 summaries of post 1"),
    (lambda lines: lines + [lines[1]], "a.csv line 14: rater 'a' answered post 1 slot 1 of form f1 already ("),
    (lambda lines: [lines[0]] + [line.replace("f1", "f2") for line in lines[1:]],
     "a.csv line 2: form_id f2 matches none of the keys given: f1 ("),
])
def test_bad_answers_are_named_by_file_and_line(tmp_path, edit, message):
    key = _write_key(tmp_path / "key.csv")
    path = _write_answers(tmp_path / "a.csv", ["a", "b"])
    path.write_text("\n".join(edit(path.read_text().splitlines())) + "\n")
    with pytest.raises(UsageError) as err:
        _run(["eval-score", "--key", str(key), "--answers", str(path)])
    assert message in str(err.value)


def test_bad_inputs_of_the_form_and_key(files, tmp_path):
    def error(argv: list[str]) -> str:
        with pytest.raises(UsageError) as err:
            _run(argv)
        return str(err.value)

    out = str(tmp_path / "out")
    assert "give --experiment NAME" in error(["eval-form", "--out", out])
    assert f"cannot read generations file {tmp_path / 'nope.jsonl'}" in error(
        ["eval-form", "--generations", str(tmp_path / "nope.jsonl"), "--out", out])
    lines = files[0].read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    for line, message in [("{not json", "line 2: not JSON"), ("[1]", "line 2: expected a JSON object"),
                          (lines[1].replace('"completion"', '"text"'), "line 2: key 'completion' is missing"),
                          (lines[1].replace('"seed": 0', '"seed": "0"'), "line 2: 'seed' must be an integer, got '0'")]:
        bad.write_text("\n".join([lines[0], line]) + "\n")
        assert f"{bad} {message}" in error(["eval-form", "--generations", str(bad), "--out", out])
    fewer = _write_run(tmp_path / "few" / GENERATIONS, 0, "DPO", "m", 0, {"p0": PROMPTS["p0"]})
    assert "only 1 prompts have a completion from every method and model" in error(
        ["eval-form", "--generations", *map(str, files), str(fewer), "--out", out, "--posts", "2", "--seeds", "0"])
    assert "training seed 1 has no run of DPO on m: every form needs every method and model (" in error(
        ["eval-form", "--generations", *map(str, files), str(fewer), "--out", out])
    assert "no run has training seed 2, 7 (the runs have seeds 0, 1)" in error(
        ["eval-form", "--generations", *map(str, files), "--out", out, "--seeds", "0", "2", "7"])
    assert "--posts must be at least 1" in error(
        ["eval-form", "--generations", str(files[0]), "--out", out, "--posts", "0"])
    other = _write_run(tmp_path / "other" / GENERATIONS, 0, "DPO", "m", 0,
                       {k: ("another post", ref) for k, (_, ref) in PROMPTS.items()})
    assert "has a different source or reference in runs" in error(
        ["eval-form", "--generations", str(files[0]), str(other), "--out", out])
    cut = tmp_path / "cut" / GENERATIONS  # the same posts, cut shorter for this run
    cut.parent.mkdir()
    cut.write_text(_write_run(tmp_path / "cut0" / GENERATIONS, 0, "DPO", "m", 0).read_text().replace(
        '"shown_source": "I read two novels', '"shown_source": "I read'))
    assert "was put to runs" in error(["eval-form", "--generations", str(files[0]), str(cut), "--out", out,
                                      "--posts", "3"])
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(files[0].read_text() + files[1].read_text())
    assert f"run {mixed} mixes runs" in error(["eval-form", "--generations", str(mixed), "--out", out])
    assert "cannot read" in error(["eval-score", "--key", str(tmp_path / "key.csv"), "--answers", str(files[0])])
    key = _write_key(tmp_path / "key.csv")
    text = key.read_text()
    answers = _write_answers(tmp_path / "a.csv", ["a"])
    key.write_text(text + text.splitlines()[1] + "\n")
    assert f"{key} line 8: post 1 slot 1 appears twice" in error(
        ["eval-score", "--key", str(key), "--answers", str(answers)])
    key.write_text(text.replace("1,1,q1,DPO,DPO,m1,run-DPO-m1,0,", "1,1,q1,DPO,DPO,m1,run-DPO-m1,1,"))
    assert f"{key} line 3: seed 0 differs from the first row's 1 (a form's summaries come from one training seed)" \
        in error(["eval-score", "--key", str(key), "--answers", str(answers)])
    for comments, problem in ((key / "comments.csv", f"{key} is a file, not a folder"),
                              (tmp_path, f"{tmp_path} is a folder, not a CSV file")):  # before the report, not after it
        assert error(["eval-score", "--key", str(key), "--answers", str(answers), "--comments", str(comments)]) \
            .endswith(f"--comments {comments}: {problem}")
    assert not Path(out).exists()


@pytest.fixture
def mlflow_store(tmp_path):
    """A real SQLite MLflow store: a sweep with three trial runs carrying generations.jsonl
    and one trial without; a second experiment with a trial but no generations."""
    from mlflow.tracking import MlflowClient

    from haepo_ray.tracking import artifact_location_for

    uri = sqlite_store(tmp_path / "mlflow.db")
    client = MlflowClient(tracking_uri=uri)
    runs = {}
    for name, systems in [("tldr", SYSTEMS[::2]), ("empty", [])]:
        exp = client.create_experiment(name, artifact_location=artifact_location_for(uri))
        parent = client.create_run(exp, tags={ROLE: "sweep"}).info.run_id
        for index, (algorithm, model) in enumerate([*systems, ("GRPO", "none")]):
            run = client.create_run(exp, tags={ROLE: "trial", PARENT_RUN: parent}).info.run_id
            if model != "none":
                path = _write_run(tmp_path / run / GENERATIONS, index, algorithm, model, 0)
                client.log_artifact(run, str(path))
                runs[run] = (algorithm, model)
            client.set_terminated(run)
    return uri, runs


def test_records_come_from_the_trial_runs_in_mlflow(mlflow_store, tmp_path, capfd):
    uri, runs = mlflow_store
    records = generations_from_mlflow("tldr", uri)
    assert {r.run_id: r.system for r in records} == runs and len(records) == 3 * 2 * len(PROMPTS)
    out = tmp_path / "form"
    assert _run(["eval-form", "--experiment", "tldr", "--tracking-uri", uri, "--out", str(out), "--posts", "3"]) == 0
    printed = capfd.readouterr()
    assert "Downloading artifacts" not in printed.out + printed.err  # no progress bar per run
    rows = list(csv.DictReader((out / "key-seed0.csv").open()))
    assert {r["run_id"]: (r["algorithm"], r["model"]) for r in rows} == runs
    assert sorted(p.name for p in out.iterdir()) == ["form-seed0.html", "key-seed0.csv"]
    html = (out / "form-seed0.html").read_text()
    assert not any(run in html for run in runs)
    with pytest.raises(LookupError, match=r"'empty' .* has no generations: none of its 1 trial runs"):
        generations_from_mlflow("empty", uri)
    with pytest.raises(LookupError, match=r"no MLflow experiment 'nope' .*there are: \['Default', 'empty', 'tldr'\]"):
        generations_from_mlflow("nope", uri)
    with pytest.raises(UsageError, match="no MLflow store at"):
        _run(["eval-form", "--experiment", "tldr", "--tracking-uri", f"sqlite:///{tmp_path / 'x.db'}",
              "--out", str(out)])


def test_form_filled_and_exported_in_headless_chromium_scores(files, tmp_path):
    from selenium.webdriver.common.by import By

    form, key_path = write_form(pick_forms(_records(files), 2, seed=3)[1], tmp_path / "form")
    key = read_key(key_path)
    system = {(k.post, k.slot): (k.algorithm, k.model) for k in key.slots.values()}
    best = {k.post: k.slot for k in sorted(key.slots.values(), key=lambda k: k.rouge_l)}  # highest ROUGE-L last
    # The scripted rater: HAEPO 5, GRPO 4, DPO 3, one less for Qwen on post 2; closest: the
    # best slot on post 1, slot 1 on post 2 (the best one there iff it is slot 1).
    base = {"HAEPO": 5, "GRPO": 4, "DPO": 3}

    def rating(post, slot):
        algorithm, model = system[post, slot]
        return base[algorithm] - (post == 2 and model == MODELS[1])

    closest = {1: best[1], 2: 1}
    comment = {1: 'too long, "dramatic"\nbut detailed', 2: "  concise  "}  # on slot 2; exported trimmed
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    with headless_chromium(download_dir=downloads) as driver:
        driver.get(form.as_uri())
        driver.find_element(By.ID, "export").click()
        assert "Not exported; missing: your rater id; post 1: the summary closest" in \
               driver.find_element(By.ID, "status").text
        for post in (1, 2):
            for slot in range(1, len(SYSTEMS) + 1):
                driver.find_element(By.CSS_SELECTOR, f'input[name="rating-{post}-{slot}"][value="{rating(post, slot)}"]').click()
            driver.find_element(By.CSS_SELECTOR, f'input[name="closest-{post}"][value="{closest[post]}"]').click()
            driver.find_element(By.CSS_SELECTOR, f'textarea[name="comment-{post}-2"]').send_keys(comment[post])
            if post == 1:
                assert not driver.find_element(By.CSS_SELECTOR, 'section[data-post="2"]').is_displayed()
                driver.find_element(By.ID, "next").click()
        driver.find_element(By.ID, "rater").send_keys("rater, 1")
        driver.find_element(By.ID, "export").click()
        exported = downloads / "answers-rater_1.csv"
        deadline = time.monotonic() + 20
        while not exported.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
        status = driver.find_element(By.ID, "status").text
    assert not errors, errors
    assert status == "Exported 12 answers to answers-rater_1.csv"
    with exported.open(newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == list(ANSWER_COLUMNS) and len(rows) == 1 + 2 * len(SYSTEMS)
    assert {row[1] for row in rows[1:]} == {"rater, 1"}
    assert {(row[2], row[3]): row[6] for row in rows[1:] if row[6]} == {
        ("1", "2"): 'too long, "dramatic"\nbut detailed', ("2", "2"): "concise"}
    report = score([key], read_answers([exported]))
    scores = report.seeds[1]
    for algorithm, model in SYSTEMS:
        want = base[algorithm] - (0.5 if model == MODELS[1] else 0)
        assert scores.cells[algorithm, model].mean == want and scores.cells[algorithm, model].raters == 1
    assert (scores.aligned, scores.votes) == (1 + (best[2] == 1), 2)
    assert [(c["post"], c["algorithm"], c["model"], c["comment"]) for c in report.comments] == [
        (str(post), *system[post, 2], comment[post].strip()) for post in (1, 2)]


def test_an_empty_completion_is_shown_as_empty_not_as_a_blank(files, tmp_path):
    records = _records(files)
    system = next(r.system for r in records if r.run_id == str(files[0]))  # blank in both its seeds
    records = [dataclasses.replace(r, completion=" ") if r.system == system and r.update == 10 else r for r in records]
    for pages in pick_forms(records, 3, seed=4).values():
        form, _ = write_form(pages, tmp_path / "form")
        html = form.read_text()
        assert html.count(EMPTY_SUMMARY) == 3 and "<p> </p>" not in html  # that system, in each post


def test_the_form_and_the_report_import_no_ray(mlflow_store, tmp_path):
    """Readers of a store (haepo llm eval-form, haepo report) run without Ray, as haepo_ray.llm does."""
    uri, runs = mlflow_store
    code = f"""
import sys
from haepo_ray.cli import main
codes = [main(["llm", "eval-form", "--experiment", "tldr", "--tracking-uri", "{uri}", "--out", "{tmp_path / 'form'}",
               "--posts", "2"]),
         main(["report", "--experiment", "tldr", "--tracking-uri", "{uri}", "--out", "{tmp_path / 'report'}"])]
print(codes, sorted(m for m in sys.modules if m == "ray" or m.startswith("ray.")))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[0, 0] []"
    assert (tmp_path / "form" / "form-seed0.html").is_file() and (tmp_path / "report" / "index.html").is_file()


def test_two_configurations_of_one_algorithm_are_two_methods_on_every_form_key_and_score(tmp_path, capsys):
    """Trial runs of a sweep over HAEPO and HAEPO with length_normalize=True (its search value
    {"algo": "HAEPO", "length_normalize": true}) and GRPO, seeds 0 and 1: the forms keep both
    HAEPO configurations (each its own slot, named as the report names it), and so do the keys,
    the scores per seed and the pooled table."""
    from mlflow.tracking import MlflowClient

    from haepo_ray.names import ALGORITHM, MODEL, SEARCH_VALUES
    from haepo_ray.tracking import artifact_location_for

    uri = sqlite_store(tmp_path / "mlflow.db")
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("configs", artifact_location=artifact_location_for(uri))
    parent = client.create_run(exp, tags={ROLE: "sweep"}).info.run_id
    methods = {"HAEPO": "HAEPO", "HAEPO (length_normalize=True)": {"algo": "HAEPO", "length_normalize": True},
               "GRPO": "GRPO"}
    for seed in (0, 1):
        for index, value in enumerate(methods.values()):
            algorithm = value if isinstance(value, str) else value["algo"]
            run = client.create_run(exp, tags={  # as a language-model sweep tags its trial runs
                ROLE: "trial", PARENT_RUN: parent, ALGORITHM: algorithm, MODEL: "m",
                SEARCH_VALUES: json.dumps({"algorithm": value, "seed": seed})}).info.run_id
            client.log_artifact(run, str(_write_run(tmp_path / run / GENERATIONS, index, algorithm, "m", seed)))
            client.set_terminated(run)
    out = tmp_path / "form"
    assert _run(["eval-form", "--experiment", "configs", "--tracking-uri", uri, "--out", str(out), "--posts", "2"]) == 0
    keys = [out / f"key-seed{seed}.csv" for seed in (0, 1)]
    for key in keys:
        rows = list(csv.DictReader(key.open()))
        assert len(rows) == 2 * 3 and {r["post"] for r in rows} == {"1", "2"}
        for post in ("1", "2"):
            assert sorted(r["method"] for r in rows if r["post"] == post) == sorted(methods)
        assert {r["method"]: r["algorithm"] for r in rows} == {m: m.split(" (")[0] for m in methods}
        html = (out / key.name.replace("key", "form").replace(".csv", ".html")).read_text()
        assert "length_normalize" not in html and "HAEPO" not in html  # still blind
    # Every rater rates HAEPO 5, its length-normalised configuration 2 and GRPO 3, on each post.
    rating = {"HAEPO": 5, "HAEPO (length_normalize=True)": 2, "GRPO": 3}
    answers = []
    for seed, key in enumerate(keys):
        rows = list(csv.DictReader(key.open()))
        path = tmp_path / f"answers-{seed}.csv"
        with path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(ANSWER_COLUMNS)
            for r in rows:
                writer.writerow([r["form_id"], f"r{seed}", r["post"], r["slot"], rating[r["method"]],
                                 int(r["slot"] == "1"), ""])
        answers.append(path)
    report = score([read_key(k) for k in keys], read_answers(answers))
    for scores in (*report.seeds.values(), report.pooled):
        assert {method: cell.mean for (method, _), cell in scores.cells.items()} == rating
    assert report.pooled.cells["HAEPO (length_normalize=True)", "m"].raters == 2
    assert _run(["eval-score", "--key", *map(str, keys), "--answers", *map(str, answers),
                 "--comments", str(tmp_path / "comments.csv")]) == 0
    pooled = capsys.readouterr().out.split("\n\n")[2].splitlines()
    assert pooled[1].split("  ")[0:1] == ["Model"] and "HAEPO (length_normalize=True)" in pooled[1]
    assert pooled[3].split() == ["m", "3.00", "±", "0.00", "5.00", "±", "0.00", "2.00", "±", "0.00"]


def test_a_file_names_its_method_by_its_records_method_or_else_its_algorithm(files, tmp_path):
    path = tmp_path / "ln" / GENERATIONS
    path.parent.mkdir()
    path.write_text("".join(json.dumps({**json.loads(line), "method": "HAEPO (length_normalize=True)"}) + "\n"
                            for line in files[0].read_text().splitlines()))
    assert {r.method for r in read_generations(path)} == {"HAEPO (length_normalize=True)"}
    assert {r.method for r in read_generations(files[0])} == {SYSTEMS[0][0]}
    path.write_text(files[0].read_text().replace('"seed": 0', '"seed": 0, "method": 1'))
    with pytest.raises(ValueError, match="line 1: 'method' must be a string, got 1"):
        read_generations(path)
