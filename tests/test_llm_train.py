"""The LM training loop: learning on the tiny model, its output files, ``haepo llm train``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import subprocess
import sys

import pytest
import torch

from haepo_ray import names
from haepo_ray.cli import main
from haepo_ray.cli.llm_options import add_settings_options, settings_from_args
from haepo_ray.llm.models import load_model
from haepo_ray.llm.rewards import length_closeness, rouge_l, semantic_similarity, token_f1
from haepo_ray.llm.run_log import rl_metrics
from haepo_ray.llm.train import LLMRun, LLMTrainSettings, train
from haepo_ray.tracking.schema import LLM_METRICS, select_metrics

RL_KEYS = {"update", "phase", "time_s", "reward_mean", "rouge_l", "semantic_similarity", "profanity_rate",
           "completion_length", "effective_num_trajectories", "kl", "loss", "peak_memory_mb",
           "peak_memory_reserved_mb", "train_time_s", "phase_time_s"}
GENERATION_KEYS = {"update", "prompt_id", "source", "reference", "instruction", "shown_source", "completion", "reward",
                   "token_f1", "semantic_similarity", "length_closeness", "rouge_l", "rouge_2", "completion_length",
                   "kl_exact",
                   "algorithm", "model", "seed"}


class CommonWords:
    """A verifiable reward: the fraction of a completion's words among the data's 64 most frequent.

    The tiny model's word-level vocabulary is ordered by frequency after its 4 special tokens.
    """

    def __init__(self, tokenizer):
        self.words = {w for w, i in tokenizer.get_vocab().items() if 4 <= i < 68}

    def __call__(self, completions, examples):
        return [sum(w in self.words for w in c.split()) / max(len(c.split()), 1) for c in completions]


def _settings(**overrides):
    base = dict(model="tiny", sft_examples=0, rl_updates=30, batch_prompts=2, group_size=8, max_new_tokens=8,
                min_new_tokens=8, max_source_words=16, lr=1e-2, eval_prompts=2, micro_batch_size=0, seed=0)
    return LLMTrainSettings(**{**base, **overrides})


@pytest.fixture(scope="module")
def common_words():
    from haepo_ray.llm.data import load_examples, split_examples

    settings = _settings()
    splits = split_examples(load_examples("aclsum"), settings.eval_prompts, settings.seed)
    _, tokenizer = load_model("tiny", texts=(f"{e.source} {e.reference}" for e in splits.sft + splits.rl))
    return CommonWords(tokenizer)


# Measured with these seeds (mean reward of the first and last 5 of 30 updates): HAEPO 0.17 -> 0.92,
# GRPO 0.18 -> 0.99, DPO 0.22 -> 0.51 (DPO pulls towards the gold summaries, whose words are
# common, not towards the reward itself). Chance is 64 / 508 = 0.13 plus frequency luck.
@pytest.mark.parametrize(("algo", "end_at_least"), [("HAEPO", 0.6), ("GRPO", 0.6), ("DPO", 0.4)])
def test_tiny_model_learns_a_verifiable_reward(tmp_path, common_words, algo, end_at_least):
    rows = train(_settings(algo=algo), tmp_path, reward_fn=common_words)
    rewards = [r["reward_mean"] for r in rows]
    start, end = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert start < 0.3, start
    assert end >= end_at_least, (start, end)


def test_output_files_follow_the_documented_schema(tmp_path, common_words):
    seen = []
    rows = train(_settings(algo="HAEPO", sft_examples=6, sft_batch=4, rl_updates=2, micro_batch_size=3,
                           eval_prompts=3), tmp_path, reward_fn=common_words, callback=seen.append)
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert metrics == rows == seen
    assert [(r["phase"], r["update"]) for r in metrics] == [("sft", 1), ("sft", 2), ("rl", 1), ("rl", 2)]
    assert set(metrics[0]) == {"update", "phase", "time_s", "loss"}
    for row in metrics[2:]:
        assert set(row) == RL_KEYS | ({"eval"} if row["update"] == 2 else set())  # evaluated after the last
        assert set(row["peak_memory_mb"]) == {"generation", "reference", "forward_backward", "optimizer"}
        assert all(math.isfinite(v) and v > 0 for v in row["peak_memory_mb"].values())
        assert row["peak_memory_reserved_mb"] == row["peak_memory_mb"]  # on CPU both are the VmHWM
        assert row["completion_length"] == 8.0  # min = max new tokens: no EOS fits
        assert 1.0 <= row["effective_num_trajectories"] <= 8.0
    generations = [json.loads(line) for line in (tmp_path / "generations.jsonl").read_text().splitlines()]
    assert len(generations) == 3 and all(set(g) == GENERATION_KEYS for g in generations)
    assert {(g["update"], g["algorithm"], g["model"], g["seed"]) for g in generations} == {(2, "HAEPO", "tiny", 0)}
    assert len({g["prompt_id"] for g in generations}) == 3
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["algo"] == "HAEPO" and config["micro_batch_size"] == 3


def test_a_float16_run_logs_each_steps_overflows_and_loses_no_step(tmp_path, common_words, monkeypatch):
    """A scaler that starts at 2**40 (float16's gradients overflow) gives the first step of SFT and
    of RL overflows, counted in their rows; the steps after begin at the scale found."""
    scaler = torch.amp.GradScaler
    monkeypatch.setattr(torch.amp, "GradScaler", lambda *args, **kwargs: scaler(*args, **kwargs, init_scale=2.0 ** 40))
    rows = train(_settings(dtype="float16", precision="mixed", sft_examples=4, sft_batch=2, rl_updates=2),
                 tmp_path, reward_fn=common_words)
    assert [(r["phase"], r["update"]) for r in rows] == [("sft", 1), ("sft", 2), ("rl", 1), ("rl", 2)]
    assert [r["float16_overflows"] > 0 for r in rows] == [True, False, True, False], rows
    assert all(math.isfinite(r["loss"]) for r in rows)
    assert set(rows[0]) == {"update", "phase", "time_s", "loss", "float16_overflows"}
    assert set(rows[2]) == RL_KEYS | {"float16_overflows"}
    assert select_metrics(rl_metrics(rows[2]), LLM_METRICS)["float16_overflows"] > 0  # what MLflow logs of a trial


def test_held_out_evaluation_every_eval_every_updates_and_at_the_end(tmp_path, common_words):
    """The held-out prompts (none of whose texts SFT or RL sees) are evaluated after updates 2
    and 3 (eval_every 2, and the last), eval_batch prompts per call, each with a greedy
    completion and eval_samples sampled: the row's eval/greedy means are those of
    generations.jsonl's records, whose parts are rewards.py's of their texts."""
    settings = _settings(sft_examples=2, sft_batch=2, rl_updates=3, eval_every=2, eval_prompts=3, group_size=2,
                         eval_batch=2, eval_samples=3)
    scored = []  # texts per reward call

    def reward(texts, examples):
        scored.append(len(texts))
        return common_words(texts, examples)

    run = LLMRun(settings, tmp_path, reward_fn=reward)
    run.sft()
    rows = list(run.rl())
    run.close()
    training = settings.batch_prompts * settings.group_size
    evaluation = [2, 2 * 3, 1, 1 * 3]  # per call of 2 then 1 prompts: greedy, then sampled
    assert scored == [training, training, *evaluation, training, *evaluation]
    held_out = [e.prompt_id for e in run.splits.eval]
    trained = {e.source for e in run.splits.sft + run.splits.rl}
    assert len(held_out) == 3 and not trained & {e.source for e in run.splits.eval}
    assert [("eval" in r) for r in rows] == [False, True, True]
    generations = [json.loads(line) for line in (tmp_path / "generations.jsonl").read_text().splitlines()]
    for row in rows[1:]:
        evaluation = row["eval"]
        assert set(evaluation) == {*names.LLM_EVAL_MODES, names.LLM_EVAL_POLICY}
        for mode in names.LLM_EVAL_MODES:
            means = evaluation[mode]
            assert set(means) == set(names.LLM_EVAL_METRICS) and all(math.isfinite(v) for v in means.values())
            assert means["completion_length"] == 8.0 and means["profanity_rate"] == 0.0
        greedy = [g for g in generations if g["update"] == row["update"]]
        assert [g["prompt_id"] for g in greedy] == held_out
        # The exact KL of the policy's own samples, per prompt in its record: never negative, > 0
        # once RL moved the policy; those samples may end early (EOS allowed): not min_new_tokens 8.
        kl = evaluation[names.LLM_EVAL_POLICY]
        assert set(kl) == set(names.LLM_EVAL_POLICY_METRICS)
        assert kl["kl_exact"] == pytest.approx(sum(g["kl_exact"] for g in greedy) / 3)
        assert all(g["kl_exact"] > 0 for g in greedy)
        assert 1.0 <= kl["completion_length"] <= 8.0
        for key in set(names.LLM_EVAL_METRICS) - {"profanity_rate"}:
            column = "reward" if key == names.LLM_REWARD else key
            assert evaluation["greedy"][key] == pytest.approx(sum(g[column] for g in greedy) / 3), key
        for g in greedy:
            assert g["reward"] == common_words([g["completion"]], None)[0]
            assert g["token_f1"] == token_f1(g["completion"], g["reference"])
            assert g["length_closeness"] == length_closeness(g["completion"], g["reference"])
            assert g["rouge_l"] == rouge_l(g["completion"], g["reference"])
            similarity, = semantic_similarity([g["completion"]], [g["reference"]])
            assert g["semantic_similarity"] == pytest.approx(similarity)
    # Sampled at temperature 1, not greedy.
    assert rows[1]["eval"]["sampled"] != rows[1]["eval"]["greedy"]


def test_the_exact_kl_samples_the_policy_with_eos_allowed(tmp_path, common_words):
    """min_new_tokens = max_new_tokens = 8 holds the sampled completions to 8 tokens; the exact
    KL's samples are the policy's own, EOS allowed from the first token: with an LM head that
    favours EOS (a bias of +4 on its logit) they end early."""
    settings = _settings(sft_examples=2, sft_batch=2, rl_updates=1, eval_prompts=2, eval_batch=2, kl_samples=3)
    run = LLMRun(settings, tmp_path, reward_fn=common_words)
    run.sft()
    model = run.policy.model
    head = model.lm_head
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True, dtype=head.weight.dtype)
    with torch.no_grad():
        biased.weight.copy_(head.weight)
        biased.bias.zero_()
        biased.bias[run.tokenizer.eos_token_id] = 4.0
    model.lm_head = biased
    (row,) = list(run.rl())
    run.close()
    assert settings.min_new_tokens == settings.max_new_tokens == 8
    assert row["eval"]["sampled"]["completion_length"] == 8.0
    assert 1.0 <= row["eval"][names.LLM_EVAL_POLICY]["completion_length"] < 8.0
    assert row["eval"][names.LLM_EVAL_POLICY]["kl_exact"] > 0


def test_train_time_is_the_whole_runs_and_holds_its_phases(tmp_path, common_words):
    """``train_time_s`` is the run's wall time from its start (loading, SFT, updates and their
    evaluation), not the updates' ``time_s`` alone; ``phase_time_s`` are the cumulative seconds
    of each phase within it, and a restored run goes on from its checkpoint's. Bookkeeping,
    not speed: every phase ran, so each is > 0, and they fit in the total."""
    settings = _settings(sft_examples=2, sft_batch=2, rl_updates=3, eval_every=1, eval_prompts=1)
    run = LLMRun(settings, tmp_path / "run", reward_fn=common_words)
    run.sft()
    updates = run.rl()
    first = [next(updates), next(updates)]
    run.save(tmp_path / "checkpoint")
    run.close()
    restored = LLMRun(settings, tmp_path / "restored", reward_fn=common_words)
    restored.restore(tmp_path / "checkpoint")
    rows = first + list(restored.rl())
    restored.close()
    assert [r["update"] for r in rows] == [1, 2, 3]
    for before, row in zip([None, *rows], rows):
        phases = row[names.LLM_PHASE_TIME]
        assert list(phases) == list(names.LLM_TIME_PHASES) and all(v > 0 for v in phases.values()), phases
        assert row[names.LLM_TRAIN_TIME] >= sum(phases.values()) > row[names.LLM_UPDATE_TIME]
        if before is not None:
            assert row[names.LLM_TRAIN_TIME] > before[names.LLM_TRAIN_TIME]
            assert all(phases[p] >= before[names.LLM_PHASE_TIME][p] for p in phases)
    # The restored run's loading adds to the checkpoint's, which it carries on.
    assert rows[2][names.LLM_PHASE_TIME]["load"] > rows[1][names.LLM_PHASE_TIME]["load"]
    assert rows[2][names.LLM_PHASE_TIME]["sft"] == rows[1][names.LLM_PHASE_TIME]["sft"]


def test_a_stochastically_rounded_run_restored_from_a_checkpoint_ends_with_the_weights_of_one_never_stopped(
        tmp_path, common_words):
    """The rounding's random bits depend on the seed and the step, both in the checkpoint."""
    settings = _settings(dtype="bfloat16", rounding="stochastic", lr=1e-4, sft_examples=2, sft_batch=2,
                         rl_updates=3, group_size=4, eval_prompts=1)
    weights = {}
    for name, stop in (("whole", None), ("stopped", 2)):
        run = LLMRun(settings, tmp_path / name, reward_fn=common_words)
        run.sft()
        for row in run.rl():
            if row["update"] == stop:
                run.save(tmp_path / "checkpoint")
                break
        if stop:
            run.close()
            run = LLMRun(settings, tmp_path / "restored", reward_fn=common_words)
            run.restore(tmp_path / "checkpoint")
            assert [row["update"] for row in run.rl()] == [3]
        weights[name] = {k: v.clone() for k, v in run.model.state_dict().items()}
        run.close()
    assert all(torch.equal(weights["whole"][k], weights["stopped"][k]) for k in weights["whole"])


def test_nan_reward_stops_training_with_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="reward of completion 0 is nan"):
        train(_settings(rl_updates=1), tmp_path, reward_fn=lambda c, e: [math.nan] * len(c))


def _flushes() -> bool:
    """Whether this thread flushes subnormal floats: 1e-30 * 1e-10 is float32's subnormal 1e-40, or 0."""
    import torch

    return float(torch.tensor([1e-30]) * 1e-10) == 0.0


@pytest.mark.parametrize("flush", [True, False])
def test_updates_run_with_subnormals_flushed_by_default_and_the_flag_cleared_after(tmp_path, flush):
    """The rewards are computed inside the update and its evaluation: they see the thread's flag
    (flush_denormal, default true), which is off again once the run's updates are done."""
    seen = []

    def reward(completions, examples):
        seen.append(_flushes())
        return [0.5] * len(completions)

    assert not _flushes()
    small = dict(rl_updates=2, group_size=2, max_new_tokens=4, min_new_tokens=4, eval_prompts=1)
    train(_settings(**small) if flush else _settings(**small, flush_denormal=False), tmp_path, reward_fn=reward)
    assert seen == [flush] * 4 and not _flushes()  # 2 updates, the evaluation's greedy and sampled completions


def test_cli_runs_the_tiny_model(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["llm", "train", "--model", "tiny", "--algo", "GRPO", "--sft-examples", "4", "--rl-updates", "2",
                 "--batch-prompts", "1", "--group-size", "2", "--max-new-tokens", "4", "--eval-prompts", "1",
                 "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "rl       2 | reward" in printed and str(out) in printed
    assert [json.loads(x)["phase"] for x in (out / "metrics.jsonl").read_text().splitlines()] == ["sft", "rl", "rl"]
    assert len((out / "generations.jsonl").read_text().splitlines()) == 1

    # the same --out again: refused before any work, the first run's files as they were
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    assert main(["llm", "train", "--model", "tiny", "--rl-updates", "1", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"haepo llm: error: --out {out} holds an earlier run's metrics.jsonl and generations.jsonl, which this run "
        "would overwrite: give a new folder (or remove that one)")
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before
    # a run that failed before its first row (its files empty, as it made them) leaves nothing to keep:
    # --out is taken
    failed = tmp_path / "failed"
    failed.mkdir()
    for name in ("config.json", "metrics.jsonl", "generations.jsonl"):
        (failed / name).write_text("{}" if name == "config.json" else "")
    assert main(["llm", "train", "--model", "tiny", "--algo", "GRPO", "--sft-examples", "2", "--rl-updates", "1",
                 "--batch-prompts", "1", "--group-size", "2", "--max-new-tokens", "4", "--eval-prompts", "1",
                 "--out", str(failed)]) == 0


@pytest.mark.parametrize(("argv", "message"), [
    (["--group-size", "0"], "group_size must be an integer >= 1, got 0"),
    (["--seed", "-1", "--sft-examples", "0", "--rl-updates", "1", "--batch-prompts", "1", "--max-new-tokens", "2",
      "--eval-prompts", "1"], "seed must be an integer >= 0, got -1"),  # small: it ran before
    (["--dtype", "float16", "--sft-examples", "0", "--rl-updates", "1", "--batch-prompts", "1", "--max-new-tokens",
      "2", "--eval-prompts", "1"], "dtype float16 with precision 'pure' trains AdamW in float16"),  # it made NaNs
    (["--group-size", "1"], "group_size 1: HAEPO's weights are a softmax over the group, and a group of one has "
     "weight 1, so the RL updates cannot learn from the reward's value: use group_size >= 2"),
    (["--eval-batch", "0"], "eval_batch must be an integer >= 1, got 0"),
    (["--eval-samples", "0"], "eval_samples must be an integer >= 1, got 0"),
    (["--kl-samples", "0"], "kl_samples must be an integer >= 1, got 0"),
    (["--dpo-pairs", "best", "--algo", "DPO"], r"dpo_pairs must be one of \('gold', 'reward'\), got 'best'"),
    (["--estimator", "paper"], r"estimator must be one of \('weights', 'unbiased'\), got 'paper'"),
    (["--min-new-tokens", "9", "--max-new-tokens", "4"], r"min_new_tokens \(9\) exceeds max_new_tokens \(4\)"),
    (["--data", "tldr:/nonexistent/tldr.jsonl"], "TL;DR file /nonexistent/tldr.jsonl does not exist"),
    (["--device", "tpu"], "device must be cpu or cuda"),
    (["--lora-target-modules", "q_proj", "k_proj"], "--lora-target-modules: this run would not read it: it sets "
     "LoRA's adapters, and with lora_r 0 there are none"),
    (["--algo", "GRPO", "--clip-param", "0.1"], "--clip-param: this run would not read it: .* that ratio is 1 "
     "unless num_iterations > 1; leave it out"),
    (["--algo", "DPO", "--beta-kl", "0", "--no-length-normalize"], "--beta-kl: this run would not read it: DPO's "
     "loss has no entropy bonus and no KL penalty .*\n--length-normalize: this run would not read it: it sets HAEPO"),
    (["--logits-chunk", "64"], "--logits-chunk: this run would not read it"),
    (["--dtype", "bfloat16", "--rounding", "stochastic", "--adamw", "foreach"], "--adamw: this run would not read "
     "it: it is torch's AdamW's, and rounding 'stochastic' steps each parameter in chunks of its own"),
    (["--rounding", "stochastic"], "rounding 'stochastic' rounds the AdamW steps of bfloat16 weights"),
])
def test_cli_usage_errors(tmp_path, capsys, argv, message):
    code = main(["llm", "train", "--model", "tiny", "--out", str(tmp_path), *argv])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("haepo llm: error: ")
    assert re.search(message, err), err


def test_data_a_model_that_cannot_be_read_or_its_missing_lora_target_is_refused_before_out_is_made(tmp_path, capsys):
    data, model, out = tmp_path / "tldr.jsonl", tmp_path / "model", tmp_path / "run"
    data.write_bytes('{"post": "caf\u00e9", "summary": "s"}\n'.encode("latin-1"))
    assert main(["llm", "train", "--model", "tiny", "--data", f"tldr:{data}", "--out", str(out)]) == 2
    assert f"cannot read TL;DR file {data}: not UTF-8 text (byte 0xe9 at offset 13)" in capsys.readouterr().err
    model.mkdir()
    (model / "config.json").write_text("{")
    assert main(["llm", "train", "--model", str(model), "--out", str(out)]) == 2
    assert f"model '{model}' cannot be loaded from its folder (It looks like the config file" in capsys.readouterr().err
    assert main(["llm", "memory", "--model", str(model)]) == 2  # its estimate reads the config alone
    assert f"model '{model}': its config.json cannot be read (It looks like" in capsys.readouterr().err
    lora = ["--lora-r", "4", "--lora-target-modules", "q_proj", "v_projj"]  # peft would adapt q_proj alone
    assert main(["llm", "train", "--model", "tiny", *lora, "--sft-examples", "1", "--rl-updates", "1",
                 "--eval-prompts", "2", "--out", str(out)]) == 2
    train_err = capsys.readouterr().err
    assert main(["llm", "memory", "--model", "tiny", "--algo", "HAEPO", *lora]) == 2
    for err in (train_err, capsys.readouterr().err):
        assert "lora_target_modules ['q_proj', 'v_projj']: in the llama model, 'v_projj' names no module" in err
    # the run's prompts (ACLSum's longest here: 333 tokens) before its SFT, not at its first sampling
    assert main(["llm", "train", "--model", "tiny", "--max-new-tokens", "2000", "--sft-examples", "2", "--out",
                 str(out)]) == 2
    assert re.search(r"a prompt of \d+ tokens and max_new_tokens 2000 overrun the llama model's context of 2048 tokens "
                     r".* \(the run's longest prompt\)\n", capsys.readouterr().err)
    assert not out.exists()


@pytest.mark.parametrize(("argv", "expected"), [
    (["--algo", "GRPO", "--num-iterations", "2", "--clip-param", "0.1"], {"num_iterations": 2, "clip_param": 0.1}),
    (["--lora-r", "4", "--lora-alpha", "8"], {"lora_r": 4, "lora_alpha": 8.0}),
    (["--logits", "chunked", "--logits-chunk", "64"], {"logits_chunk": 64}),
    (["--algo", "DPO", "--dpo-beta", "0.3"], {"dpo_beta": 0.3}),
    (["--algo", "DPO", "--lr", "1e-4"], {"beta_kl": 0.01}),  # the betas' defaults, which DPO was not given
])
def test_options_the_run_reads_are_taken(argv, expected):
    parser = argparse.ArgumentParser()
    fields = [f.name for f in dataclasses.fields(LLMTrainSettings)]
    add_settings_options(parser, fields)
    settings = settings_from_args(parser.parse_args(argv), fields)
    assert {name: getattr(settings, name) for name in expected} == expected


def test_an_out_folder_that_is_a_file_is_a_usage_error_before_any_work(tmp_path, capsys):
    (tmp_path / "a-file").write_text("")
    for argv in (["train", "--model", "tiny", "--out", str(tmp_path / "a-file" / "run")],
                 ["eval-form", "--generations", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "a-file")]):
        assert main(["llm", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"haepo llm: error: --out {argv[-1]}: {tmp_path / 'a-file'} is a file, not a folder"), err


@pytest.mark.slow
def test_smollm2_on_aclsum_end_to_end(tmp_path):
    rows = train(LLMTrainSettings(model="smollm2", sft_examples=2, sft_batch=2, rl_updates=2, batch_prompts=1,
                                  group_size=2, max_new_tokens=16, eval_prompts=1, max_source_words=120), tmp_path)
    rl = [r for r in rows if r["phase"] == "rl"]
    assert len(rl) == 2 and all(0 < r["reward_mean"] <= 1 for r in rl)
    assert len((tmp_path / "generations.jsonl").read_text().splitlines()) == 1


def test_llm_modules_import_neither_ray_nor_transformers():
    code = ("import sys, haepo_ray.llm.train, haepo_ray.cli.llm; "
            "print(sorted(m for m in ('ray', 'transformers', 'sentence_transformers') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
