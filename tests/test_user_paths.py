"""The paths a user gives (:mod:`haepo_ray.user_paths`): every text file is read by
``read_text``, so one that is not UTF-8, or cannot be read, is an error naming it and the first
bad byte, never a traceback of the codec; a sweep's results folder that cannot be made is
refused before anything starts."""

from __future__ import annotations

import pytest
from helpers import SMOKE, forbid_ray_start

from haepo_ray import jobs
from haepo_ray.llm.data import load_tldr
from haepo_ray.llm.eval_form import read_generations
from haepo_ray.llm.eval_score import read_answers, read_key
from haepo_ray.sweep.kinds import load_spec
from haepo_ray.sweep.spec import SpecError

READERS = {  # what the message calls the file -> a reader of it, the error it raises
    "the spec": (load_spec, SpecError),
    "TL;DR file": (load_tldr, ValueError),
    "generations file": (read_generations, ValueError),
    "the CSV file": (read_key, ValueError),
    "the Ray auth token --auth-token-file": (lambda path: jobs.find_token(str(path)), jobs.JobError),
}


@pytest.mark.parametrize("what", READERS)
def test_a_file_that_is_not_utf8_is_named_with_its_first_bad_byte(tmp_path, what):
    read, error = READERS[what]
    path = tmp_path / "latin1.jsonl"
    path.write_bytes('{"name": "caf\u00e9"}\n'.encode("latin-1"))
    with pytest.raises(error) as err:
        read(path)
    assert str(err.value) == f"cannot read {what} {path}: not UTF-8 text (byte 0xe9 at offset 13)"


@pytest.mark.parametrize("what", [what for what in READERS if what != "TL;DR file"])  # (it must be a file)
def test_a_file_that_cannot_be_read_is_named_with_why(tmp_path, what):
    read, error = READERS[what]
    with pytest.raises(error) as err:
        read(tmp_path)  # a folder
    assert str(err.value) == f"cannot read {what} {tmp_path}: Is a directory"


def test_csv_answers_keep_a_quoted_line_break_as_written_and_lines_count_records(tmp_path):
    """The CSV files are read without newline translation, as :mod:`csv` asks: a comment's
    CRLF stays CRLF, and the next record's ``where`` names its line of the file."""
    path = tmp_path / "answers-r1.csv"
    path.write_bytes(b"form_id,rater,post,slot,rating,closest,comment\r\n"
                     b'f1,r1,0,0,4,1,"too long\r\nbut clear"\r\nf1,r1,0,1,2,0,vague\r\n')
    first, second = read_answers([path])
    assert first.comment == "too long\r\nbut clear"
    assert (second.comment, second.where) == ("vague", f"{path} line 4")


def test_a_tldr_parquet_file_that_is_not_parquet_is_named(tmp_path):
    path = tmp_path / "train.parquet"
    path.write_text("post,summary\n")
    with pytest.raises(ValueError, match=rf"^cannot read TL;DR file {path}: .*not a parquet file"):
        load_tldr(str(path))


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_a_sweep_whose_results_folder_cannot_be_made_is_refused_before_it_starts(tmp_path, monkeypatch, capsys,
                                                                                 dry_run):
    """Before: a run made its MLflow parent run, started Ray, and died on pyarrow's
    NotADirectoryError; a dry run printed the folder."""
    from haepo_ray.cli import main

    forbid_ray_start(monkeypatch)
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "smoke.yaml"
    spec.write_text(SMOKE.read_text())
    (tmp_path / "results").write_text("")
    assert main(["sweep", str(spec), "--storage-path", "results/sweeps", *dry_run]) == 2
    root = tmp_path.resolve()
    assert (f"haepo sweep: error: the sweep's results folder {root}/results/sweeps/smoke: {root}/results is a file, "
            "not a folder: give another --storage-path (or the spec's storage_path)") in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results", "smoke.yaml"]  # no MLflow store either
