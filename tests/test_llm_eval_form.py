"""The blinded human-evaluation form: records (files, a real SQLite MLflow store), the seeded
choice and shuffle, blinding, the scorer against hand-computed answers, bad input, and the
form filled and exported in headless Chromium."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
from chromium import headless_chromium

from haepo_ray.cli import UsageError
from haepo_ray.cli.llm_eval import add_parsers
from haepo_ray.llm.eval_form import (
    GENERATIONS, generations_from_mlflow, pick_posts, read_generations, rouge_l, write_form)
from haepo_ray.llm.eval_page import ANSWER_COLUMNS, EMPTY_SUMMARY
from haepo_ray.llm.eval_score import KeyRow, format_scores, read_answers, read_key, score
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
                                    "reference": reference, "completion": text, "reward": 0.5,
                                    "algorithm": algorithm, "model": model, "seed": seed}) + "\n")
    return path


@pytest.fixture
def files(tmp_path) -> list[Path]:
    """One run per (algorithm, model), and a second seed of HAEPO on Llama."""
    runs = [_write_run(tmp_path / f"{a}-{m}-s0" / GENERATIONS, i, a, m, 0) for i, (a, m) in enumerate(SYSTEMS)]
    return runs + [_write_run(tmp_path / f"{ALGORITHMS[0]}-{MODELS[0]}-s1" / GENERATIONS, 0, *SYSTEMS[0], 1)]


def _records(files):
    return [r for f in files for r in read_generations(f)]


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="haepo llm")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_each_post_has_every_algorithm_and_model_once_in_a_seeded_order(files):
    pages = pick_posts(_records(files), 2, seed=0)
    assert len(pages) == 2 and len({p.prompt_id for p in pages}) == 2
    for page in pages:
        assert sorted(g.system for g in page.slots) == sorted(SYSTEMS)
        assert {g.update for g in page.slots} == {10}  # the last update's completions
        assert {(g.source, g.reference) for g in page.slots} == {PROMPTS[page.prompt_id]}
    orders = [[g.system for g in p.slots] for p in pages]
    assert orders[0] != orders[1]  # shuffled per post
    again = pick_posts(_records(files), 2, seed=0)
    assert [[(g.run_id, g.system) for g in p.slots] for p in again] == \
           [[(g.run_id, g.system) for g in p.slots] for p in pages]
    other = pick_posts(_records(files), 2, seed=1)
    assert [[g.system for g in p.slots] for p in other] != orders
    # HAEPO on Llama has two seeds: the form seed picks one of them.
    chosen = {g.seed for s in range(8) for p in pick_posts(_records(files), 1, s)
              for g in p.slots if g.system == SYSTEMS[0]}
    assert chosen == {0, 1}


def test_form_is_blinded_escaped_and_reproducible(files, tmp_path):
    form, key = write_form(pick_posts(_records(files), 3, seed=4), tmp_path / "form")
    html = form.read_text()
    lowered = html.lower()
    for secret in [*ALGORITHMS, *MODELS, *(str(f) for f in files), *(f.parent.name for f in files)]:
        assert secret.lower() not in lowered, secret
    rows = list(csv.DictReader(key.open()))
    assert len(rows) == 3 * len(SYSTEMS)
    assert {r["run_id"] for r in rows} <= {str(f) for f in files}
    for _, reference in PROMPTS.values():
        assert reference not in html  # the author's TL;DR decides alignment: never shown
    assert "&lt;b&gt;&amp; lose&lt;/b&gt;" in html and "<b>& lose" not in html
    assert html.count('class="post"') == 3 and html.count('class="summary"') == 3 * len(SYSTEMS)
    assert "http" not in html and "src=" not in html  # self-contained
    assert 'data-form="' + rows[0]["form_id"] + '"' in html
    key_text = key.read_text()
    write_form(pick_posts(_records(files), 3, seed=4), tmp_path / "again")
    assert (tmp_path / "again" / "form.html").read_text() == html
    assert (tmp_path / "again" / "key.csv").read_text() == key_text


def test_rouge_l_is_the_lcs_f_measure():
    # LCS("a b c d", "a c x d") = a c d: P = 3/4, R = 3/4.
    assert rouge_l("A b, c d!", "a c x d") == pytest.approx(0.75)
    assert rouge_l("", "a") == rouge_l("x y", "a b") == 0.0


# Hand-computed: key of 2 posts x 3 slots, answers of raters a and b (a.csv) and c (c.csv).
KEY = [KeyRow("f1", 1, 1, "DPO", "m1", "r1", 0.2), KeyRow("f1", 1, 2, "HAEPO", "m1", "r2", 0.5),
       KeyRow("f1", 1, 3, "HAEPO", "m2", "r3", 0.5), KeyRow("f1", 2, 1, "HAEPO", "m2", "r3", 0.1),
       KeyRow("f1", 2, 2, "HAEPO", "m1", "r2", 0.3), KeyRow("f1", 2, 3, "DPO", "m1", "r1", 0.4)]
# rater -> post -> (ratings of slots 1-3, the slot chosen as closest)
ANSWERS = {"a": {1: ((2, 5, 4), 3), 2: ((3, 4, 3), 2)},
           "b": {1: ((1, 4, 4), 1), 2: ((2, 5, 2), 3)},
           "c": {1: ((3, 3, 5), 2)}}


def _write_answers(path: Path, raters: list[str], form_id: str = "f1") -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(ANSWER_COLUMNS)
        for rater in raters:
            for post, (ratings, chosen) in ANSWERS[rater].items():
                for slot, rating in enumerate(ratings, 1):
                    writer.writerow([form_id, rater, post, slot, rating, int(slot == chosen)])
    return path


def _write_key(path: Path) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["form_id", "post", "slot", "prompt_id", "algorithm", "model", "run_id",
                         "seed", "update", "rouge_l"])
        for k in KEY:
            writer.writerow([k.form_id, k.post, k.slot, f"q{k.post}", k.algorithm, k.model, k.run_id, 0, 10, k.rouge_l])
    return path


def test_scores_match_hand_computed_answers(tmp_path, capsys):
    key = _write_key(tmp_path / "key.csv")
    answers = [_write_answers(tmp_path / "a.csv", ["a", "b"]), _write_answers(tmp_path / "c.csv", ["c"])]
    scores = score(read_key(key), read_answers(answers))
    # Rater means: HAEPO/m1 a (5+4)/2, b (4+5)/2, c 3; DPO/m1 2.5, 1.5, 3; HAEPO/m2 3.5, 3, 5.
    haepo_m1, dpo_m1, haepo_m2 = (scores.cells[s] for s in [("HAEPO", "m1"), ("DPO", "m1"), ("HAEPO", "m2")])
    assert (haepo_m1.mean, haepo_m1.std, haepo_m1.raters) == (pytest.approx(4.0), pytest.approx(math.sqrt(9 / 12)), 3)
    assert (dpo_m1.mean, dpo_m1.std) == (pytest.approx(7 / 3), pytest.approx(math.sqrt(7 / 12)))
    assert (haepo_m2.mean, haepo_m2.std) == (pytest.approx(23 / 6), pytest.approx(math.sqrt(13 / 12)))
    assert ("DPO", "m2") not in scores.cells
    # Votes: a/1 slot 3 (tied best), a/2 slot 2 (no), b/1 slot 1 (no), b/2 slot 3 (best), c/1 slot 2 (tied best).
    assert (scores.aligned, scores.votes, scores.raters) == (3, 5, 3)
    assert _run(["eval-score", "--key", str(key), *map(str, answers)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["Model", "DPO", "HAEPO"]
    assert lines[2].split() == ["m1", "2.33", "±", "0.76", "4.00", "±", "0.87"]
    assert lines[3].split() == ["m2", "-", "3.83", "±", "1.04"]
    assert "alignment rate: 0.600 (3 of 5 votes" in out and "over 3 raters" in out
    one = score(KEY, [a for a in read_answers(answers[1:])])
    assert math.isnan(one.cells["HAEPO", "m1"].std) and "3.00 ± n/a" in format_scores(one)


@pytest.mark.parametrize("edit, message", [
    (lambda lines: lines[:3] + ["f1,a,1,3,4"] + lines[4:], "a.csv line 4: expected 6 fields"),
    (lambda lines: [lines[0].replace("rating", "score")] + lines[1:], "a.csv line 1: columns ['rating'] are missing"),
    (lambda lines: lines + ["f1,d,3,1,4,1"], "a.csv line 14: post 3 slot 1 is not in the key"),
    (lambda lines: lines[:1] + ["f1,a,1,1,6,0"] + lines[2:], "a.csv line 2: rating must be 1-5 (1 Poor, 2 Fair"),
    (lambda lines: lines[:1] + ["f1,a,1,1,x,0"] + lines[2:], "a.csv line 2: rating must be an integer, got 'x'"),
    (lambda lines: lines[:1] + ["f1,a,1,1,2,2"] + lines[2:], "a.csv line 2: closest must be 0 or 1"),
    (lambda lines: lines[:1] + ["f1, ,1,1,2,0"] + lines[2:], "a.csv line 2: the rater id is empty"),
    (lambda lines: lines[:1] + ["f1,a,1,1,2,1"] + lines[2:], "rater 'a' chose 2 summaries of post 1"),
    (lambda lines: lines + [lines[1]], "a.csv line 14: rater 'a' answered post 1 slot 1 already (" ),
    (lambda lines: [lines[0]] + [line.replace("f1", "f2") for line in lines[1:]], "is not this key's f1"),
])
def test_bad_answers_are_named_by_file_and_line(tmp_path, edit, message):
    key = _write_key(tmp_path / "key.csv")
    path = _write_answers(tmp_path / "a.csv", ["a", "b"])
    path.write_text("\n".join(edit(path.read_text().splitlines())) + "\n")
    with pytest.raises(UsageError) as err:
        _run(["eval-score", "--key", str(key), str(path)])
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
    assert "only 1 prompts have a completion from every algorithm and model" in error(
        ["eval-form", "--generations", *map(str, files), str(fewer), "--out", out, "--posts", "2"])
    assert "--posts must be at least 1" in error(
        ["eval-form", "--generations", str(files[0]), "--out", out, "--posts", "0"])
    other = _write_run(tmp_path / "other" / GENERATIONS, 0, "DPO", "m", 0,
                       {k: ("another post", ref) for k, (_, ref) in PROMPTS.items()})
    assert "has a different source or reference in runs" in error(
        ["eval-form", "--generations", str(files[0]), str(other), "--out", out])
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(files[0].read_text() + files[1].read_text())
    assert f"run {mixed} mixes runs" in error(["eval-form", "--generations", str(mixed), "--out", out])
    assert "cannot read" in error(["eval-score", "--key", str(tmp_path / "key.csv"), str(files[0])])
    key = _write_key(tmp_path / "key.csv")
    key.write_text(key.read_text() + key.read_text().splitlines()[1] + "\n")
    answers = _write_answers(tmp_path / "a.csv", ["a"])
    assert f"{key} line 8: post 1 slot 1 appears twice" in error(["eval-score", "--key", str(key), str(answers)])
    assert not Path(out).exists()


@pytest.fixture
def mlflow_store(tmp_path):
    """A real SQLite MLflow store: a sweep with three trial runs carrying generations.jsonl
    and one trial without; a second experiment with a trial but no generations."""
    from mlflow.tracking import MlflowClient

    from haepo_ray.tracking import artifact_location_for

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
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
    rows = list(csv.DictReader((out / "key.csv").open()))
    assert {r["run_id"]: (r["algorithm"], r["model"]) for r in rows} == runs
    html = (out / "form.html").read_text()
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

    form, key_path = write_form(pick_posts(_records(files), 2, seed=3), tmp_path / "form")
    key = read_key(key_path)
    system = {(k.post, k.slot): (k.algorithm, k.model) for k in key}
    best = {k.post: k.slot for k in sorted(key, key=lambda k: k.rouge_l)}  # highest ROUGE-L last
    # The scripted rater: HAEPO 5, GRPO 4, DPO 3, one less for Qwen on post 2; closest: the
    # best slot on post 1, slot 1 on post 2 (the best one there iff it is slot 1).
    base = {"HAEPO": 5, "GRPO": 4, "DPO": 3}

    def rating(post, slot):
        algorithm, model = system[post, slot]
        return base[algorithm] - (post == 2 and model == MODELS[1])

    closest = {1: best[1], 2: 1}
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
    scores = score(key, read_answers([exported]))
    for algorithm, model in SYSTEMS:
        want = base[algorithm] - (0.5 if model == MODELS[1] else 0)
        assert scores.cells[algorithm, model].mean == want and scores.cells[algorithm, model].raters == 1
    assert (scores.aligned, scores.votes) == (1 + (best[2] == 1), 2)


def test_an_empty_completion_is_shown_as_empty_not_as_a_blank(files, tmp_path):
    records = _records(files)
    system = next(r.system for r in records if r.run_id == str(files[0]))  # blank in both its seeds
    records = [dataclasses.replace(r, completion=" ") if r.system == system and r.update == 10 else r for r in records]
    form, _ = write_form(pick_posts(records, 3, seed=4), tmp_path / "form")
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
    assert (tmp_path / "form" / "form.html").is_file() and (tmp_path / "report" / "index.html").is_file()
