"""Completions that end early (EOS allowed: ``min_new_tokens`` 1): rollout, reward, HAEPO's L_k
and the held-out evaluation on completions of different lengths, padding masked."""

from __future__ import annotations

import json

import pytest
import torch

from haepo_ray.llm.objectives import group_loss
from haepo_ray.llm.rewards import SummaryReward
from haepo_ray.llm.rollout import _until_first_eos, sample_groups, sequence_logp, token_stats
from haepo_ray.llm.train import GENERATIONS_FILE, LLMRun, LLMTrainSettings
from haepo_ray.loss import haepo_loss

MAX_NEW = 8


def _eos_often(model, eos: int, boost: float = 4.0) -> None:
    """Raise the EOS logit by ``boost`` in every forward (a real change of the model, in
    sampling and scoring alike): sampled completions then end after a few tokens."""
    def hook(module, args, out):
        out[..., eos] += boost
        return out

    model.get_output_embeddings().register_forward_hook(hook)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A HAEPO run on the tiny model whose completions end early, after SFT, 2 updates, the
    SFT start's evaluation and one after the last update."""
    settings = LLMTrainSettings(model="tiny", sft_examples=4, sft_batch=2, rl_updates=2, batch_prompts=2, group_size=4,
                                max_new_tokens=MAX_NEW, min_new_tokens=1, max_source_words=16, eval_prompts=4,
                                eval_samples=2, micro_batch_size=3, eval_start=True, seed=0)
    out = tmp_path_factory.mktemp("eos")
    llm = LLMRun(settings, out)
    _eos_often(llm.model, llm.tokenizer.eos_token_id)
    llm.sft()
    rows = list(llm.rl())
    llm.close()
    generations = [json.loads(line) for line in (out / GENERATIONS_FILE).read_text().splitlines()]
    return llm, rows, generations


def test_sampled_completions_end_at_their_first_eos_and_their_scores_ignore_the_padding(run):
    llm, _, _ = run
    tokenizer, model = llm.tokenizer, llm.model
    prompts = ["summarize the method", "summarize the results of the paper"]
    batch, texts = sample_groups(model, tokenizer, prompts, [1, 2], [0, 1], group_size=4, max_new_tokens=MAX_NEW,
                                 min_new_tokens=1, together=True)
    lengths = batch.completion_mask.sum(1)
    assert len(set(lengths.tolist())) > 1 and lengths.min() < MAX_NEW  # completions of different lengths
    completion_ids = batch.input_ids[:, batch.prompt_width:]
    assert torch.equal(batch.completion_mask, _until_first_eos(completion_ids, [tokenizer.eos_token_id]))
    assert torch.equal(batch.attention_mask[:, batch.prompt_width:].bool(), batch.completion_mask)
    for i, n in enumerate(lengths.tolist()):
        ended = bool(completion_ids[i, n - 1] == tokenizer.eos_token_id)
        assert ended or n == MAX_NEW
        assert texts[i] == tokenizer.decode(completion_ids[i, :n - ended], skip_special_tokens=True).strip()
    with torch.no_grad():
        logp, _ = token_stats(model, batch)
        traj = sequence_logp(logp, batch.completion_mask)
        for i, n in enumerate(lengths.tolist()):  # each row alone, cut at its end: no padding
            alone = batch.rows(slice(i, i + 1))
            width = batch.prompt_width + n
            cut = type(alone)(alone.input_ids[:, :width], alone.attention_mask[:, :width],
                              alone.completion_mask[:, :n], alone.prompt_index)
            own, _ = token_stats(model, cut)
            assert traj[i].item() == pytest.approx(own.sum().item(), abs=1e-4)
        assert (logp[~batch.completion_mask] == 0).all()
        # HAEPO's loss on the padded batch is the loss on each group's L_k
        returns = torch.tensor(SummaryReward()(texts, [llm.splits.rl[0]] * len(texts)))
        loss = group_loss(llm.settings.objective(), batch, returns, logp, group_rows=4)(logp, None)
        s = llm.settings
        by_group = [haepo_loss(traj[g], traj[g], returns[g], beta_ent=s.beta_ent, beta_kl=s.beta_kl).loss
                    for g in (slice(0, 4), slice(4, 8))]
        assert loss.item() == pytest.approx(torch.stack(by_group).mean().item(), abs=1e-5)


def test_training_and_evaluation_see_completions_that_end_early(run):
    llm, rows, generations = run
    assert all(0 < r["completion_length"] < MAX_NEW for r in rows)  # mean tokens per sampled completion
    for mode in ("greedy", "sampled"):
        assert rows[-1]["eval"][mode]["completion_length"] < MAX_NEW
        assert rows[0]["eval_start"][mode]["completion_length"] < MAX_NEW
    reward = SummaryReward()
    for g in generations:
        assert 1 <= g["completion_length"] <= MAX_NEW
        example = next(e for e in llm.splits.eval if e.prompt_id == g["prompt_id"])
        assert g["reward"] == pytest.approx(reward([g["completion"]], [example])[0])
    assert sorted({g["update"] for g in generations}) == [0, 2]  # the SFT start's, then the last update's
