"""L_k of LM completions: a hand sum over tokens, padding invariant; masks; generation; the
exact per-token KL against a brute-force sum over a tiny vocabulary."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from haepo_ray.llm.rollout import (
    _until_first_eos, completion_batch, completion_logits, concat_batches, context_problem, generate, sequence_logp,
    token_kl, token_stats)

PROMPTS = ["the model writes", "we propose a method for parsing the paper"]
COMPLETIONS = ["a short summary of the paper", "results"]


def _hand_logp(model, tokenizer, prompt, completion):
    """sum_t log softmax(logits_{t-1})[y_t] over the completion + EOS, on the unpadded row."""
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0], dim=-1)
    total = 0.0
    for t in range(len(prompt_ids), ids.shape[1]):
        total += logp[t - 1, ids[0, t]].item()
    return total


def test_sequence_logp_is_the_hand_sum_over_completion_tokens(tiny_lm):
    model, tokenizer = tiny_lm
    batch = completion_batch(tokenizer, PROMPTS, COMPLETIONS)
    # Row 0 is left-padded (shorter prompt), row 1 right-padded (shorter completion).
    assert (batch.attention_mask[0] == 0).any() and not batch.completion_mask[1].all()
    with torch.no_grad():
        traj_logp = sequence_logp(token_stats(model, batch)[0], batch.completion_mask)
    expected = [_hand_logp(model, tokenizer, p, c) for p, c in zip(PROMPTS, COMPLETIONS)]
    torch.testing.assert_close(traj_logp, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-10)
    assert batch.completion_mask.sum(1).tolist() == [7, 2]  # 6 words + EOS, 1 word + EOS


def test_sequence_logp_does_not_depend_on_padding(tiny_lm):
    model, tokenizer = tiny_lm
    alone = completion_batch(tokenizer, PROMPTS[:1], COMPLETIONS[1:])
    long_row = completion_batch(tokenizer, ["a cat sat on the mat and the model writes a paper"],
                                ["the method improves accuracy results show"])
    padded = concat_batches([alone, long_row], tokenizer.pad_token_id)
    assert padded.prompt_width > alone.prompt_width
    assert padded.completion_mask.shape[1] > alone.completion_mask.shape[1]
    with torch.no_grad():
        single = sequence_logp(token_stats(model, alone)[0], alone.completion_mask)
        both = sequence_logp(token_stats(model, padded)[0], padded.completion_mask)
    torch.testing.assert_close(both[:1], single, rtol=0, atol=1e-10)


def test_entropy_of_completion_positions(tiny_lm):
    model, tokenizer = tiny_lm
    batch = completion_batch(tokenizer, PROMPTS, COMPLETIONS)
    row0 = completion_batch(tokenizer, PROMPTS[:1], COMPLETIONS[:1])  # unpadded
    with torch.no_grad():
        _, entropy = token_stats(model, batch, with_entropy=True)
        probs = torch.softmax(model(input_ids=row0.input_ids[:, :-1]).logits[0, row0.prompt_width - 1:], -1)
    hand = -(probs * torch.log(probs)).sum(-1)  # H_t = -sum_v p_v log p_v at each completion position
    torch.testing.assert_close(entropy[0], hand, rtol=0, atol=1e-10)
    assert (entropy[1, 2:] == 0).all() and (entropy[1, :2] > 0).all()  # 0 off the mask


def test_empty_completion_is_an_error():
    token_logp = torch.zeros(3, 4)
    mask = torch.tensor([[True, True, False, False], [False] * 4, [True] * 4])
    with pytest.raises(ValueError, match=r"completions \[1\] \(first 5\) have no tokens"):
        sequence_logp(token_logp, mask)


def test_completion_mask_ends_at_the_first_eos():
    ids = torch.tensor([[5, 2, 7, 2], [3, 4, 6, 8], [2, 2, 2, 2]])
    expected = torch.tensor([[True, True, False, False], [True] * 4, [True, False, False, False]])
    assert torch.equal(_until_first_eos(ids, [2]), expected)
    assert torch.equal(_until_first_eos(ids, [9, 2]), expected)


def test_generate_groups_and_masks(tiny_lm):
    model, tokenizer = tiny_lm
    torch.manual_seed(0)
    batch, texts = generate(model, tokenizer, PROMPTS, group_size=3, max_new_tokens=5, min_new_tokens=5)
    assert len(batch) == len(texts) == 6
    assert batch.prompt_index.tolist() == [0, 0, 0, 1, 1, 1]
    assert batch.completion_mask.shape == (6, 5) and batch.completion_mask.all()  # min = max tokens
    assert all(len(t.split()) <= 5 for t in texts)
    # The completion tokens decode to the texts: the batch is what was sampled.
    decoded = tokenizer.batch_decode(batch.input_ids[:, batch.prompt_width:], skip_special_tokens=True)
    assert [d.strip() for d in decoded] == texts



def test_sampling_past_the_models_context_is_refused_before_the_run_and_before_generate(tiny_lm):
    """transformers only warns (the tiny Llama's 2048 positions: a run of max_new_tokens 100000
    sampled on past them), and a model with learned positions has none past its context."""
    from haepo_ray.llm.policy import Policy
    from haepo_ray.llm.settings import LLMTrainSettings

    model, tokenizer = tiny_lm
    context = model.config.max_position_embeddings
    assert context_problem(model.config, context - 1) is None
    assert context_problem(model.config, context) == (
        f"max_new_tokens {context} overruns the llama model's context of {context} tokens (max_position_embeddings, "
        "prompt included): give fewer max_new_tokens")
    with pytest.raises(ValueError, match=f"^max_new_tokens {context} overruns the llama model's context"):
        Policy(model, LLMTrainSettings(model="tiny", max_new_tokens=context))
    prompt = " ".join(["the model writes"] * 700)  # about 2100 tokens
    with pytest.raises(ValueError, match=r"^a prompt of \d+ tokens and max_new_tokens 5 overrun the llama model's "
                                         r"context of 2048 tokens .* give fewer max_new_tokens, or shorter prompts$"):
        generate(model, tokenizer, [prompt], group_size=1, max_new_tokens=5)
    from haepo_ray.llm.capacity.estimate import estimate  # haepo llm memory --prompt-tokens, a sweep's estimates

    with pytest.raises(ValueError, match=r"^a prompt of 2000 tokens and max_new_tokens 49 overrun the llama model's"):
        estimate(LLMTrainSettings(model="tiny", max_new_tokens=49), prompt_tokens=2000)


def test_a_runs_longest_prompt_or_given_row_past_the_context_is_found_before_it_samples(tiny_lm):
    """A run checks the prompts it will sample after, padded as generate pads them, and the rows it
    is given (SFT's and DPO's gold summaries after their prompts), before its SFT."""
    from haepo_ray.llm.rollout import overrun_problem

    model, tokenizer = tiny_lm
    context = model.config.max_position_embeddings
    words = lambda n: " ".join(["the"] * n)  # noqa: E731  (one token per word)
    assert overrun_problem(tokenizer, model.config, prompts=[words(10), words(1000)], max_new_tokens=context - 1000,
                           given=[(words(1000), words(context - 1001))]) is None
    assert overrun_problem(tokenizer, model.config, prompts=[words(10), words(1000)],
                           max_new_tokens=context - 999) == (
        f"a prompt of 1000 tokens and max_new_tokens {context - 999} overrun the llama model's context of {context} "
        "tokens (max_position_embeddings, prompt included): give fewer max_new_tokens, or shorter prompts (the run's "
        "longest prompt)")
    static = context - 1024  # prompts padded to a multiple of 64 tokens: 1000 takes 1024
    assert overrun_problem(tokenizer, model.config, prompts=[words(1000)], max_new_tokens=static) is None
    assert "a prompt of 1024 tokens" in overrun_problem(tokenizer, model.config, prompts=[words(1000)],
                                                        max_new_tokens=static + 1, decoding="static")
    assert overrun_problem(tokenizer, model.config, prompts=[], max_new_tokens=8,
                           given=[(words(1000), words(context - 1000))]) == (
        f"a prompt and its given completion (SFT's or DPO's gold summary) of {context + 1} tokens with EOS overrun the "
        f"llama model's context of {context} tokens (max_position_embeddings): give shorter prompts (max_source_words)")

def test_static_decoding_generates_what_dynamic_decoding_generates(tiny_lm):
    model, tokenizer = tiny_lm
    kwargs = {"group_size": 2, "max_new_tokens": 6, "min_new_tokens": 6}
    for mode in ({"greedy": True}, {}):  # greedy, then sampled from the same seed
        runs = []
        for decoding in ("dynamic", "static"):
            torch.manual_seed(0)
            runs.append(generate(model, tokenizer, PROMPTS, decoding=decoding, **kwargs, **mode))
        (dynamic, dynamic_texts), (static, static_texts) = runs
        assert static_texts == dynamic_texts
        # static pads the prompts to 64 tokens for generate; the batch keeps only what a row needs
        for field in ("input_ids", "attention_mask", "completion_mask", "prompt_index"):
            assert torch.equal(getattr(static, field), getattr(dynamic, field)), (mode, field)


def test_static_decoding_logits_equal_dynamic_decodings_within_rounding(tiny_lm):
    from haepo_ray.llm.rollout import _encode_prompts, padded_prompt_width, sampling_kwargs

    model, tokenizer = tiny_lm
    assert padded_prompt_width(12, "static") == 64 and padded_prompt_width(65, "static") == 128
    assert padded_prompt_width(12, "dynamic") == 12
    logits = {}
    for decoding in ("dynamic", "static"):
        ids, mask = _encode_prompts(tokenizer, PROMPTS, decoding)
        sampling = sampling_kwargs(eos_token_id=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id,
                                   max_new_tokens=8, min_new_tokens=8, greedy=True, decoding=decoding)
        out = model.generate(input_ids=ids, attention_mask=mask, output_logits=True, return_dict_in_generate=True,
                             **sampling)
        logits[decoding] = torch.stack(out.logits)
    # measured 1.2e-7 (float32, torch 2.13 CPU): rounding of a longer, masked attention row
    assert (logits["static"] - logits["dynamic"]).abs().max() < 1e-5


def _perturbed(model, seed: int = 1, scale: float = 0.3):
    """A copy of ``model`` with noise on every weight: another policy on the same vocabulary."""
    other = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return other


def _brute_kl(model, ref, ids: list[int], start: int) -> list[float]:
    """KL(pi || pi_ref) at each position from ``start`` of the unpadded row ``ids``: a Python sum
    over every token of the vocabulary of p_v (log p_v - log q_v)."""
    with torch.no_grad():
        p = torch.softmax(model(input_ids=torch.tensor([ids])).logits[0], -1)
        q = torch.softmax(ref(input_ids=torch.tensor([ids])).logits[0], -1)
    out = []
    for t in range(start, len(ids)):
        pt, qt = p[t - 1].tolist(), q[t - 1].tolist()
        out.append(sum(pv * (math.log(pv) - math.log(qv)) for pv, qv in zip(pt, qt)))
    return out


def test_token_kl_is_the_sum_over_the_vocabulary_at_each_completion_position(tiny_lm):
    """On padded rows (row 0 left-padded, row 1 right-padded) the exact per-token KL equals the
    brute-force sum over the 25-token vocabulary on each unpadded row; 0 off the mask."""
    model, tokenizer = tiny_lm
    ref = _perturbed(model)
    batch = completion_batch(tokenizer, PROMPTS, COMPLETIONS)
    with torch.no_grad():
        kl = token_kl(completion_logits(model, batch), completion_logits(ref, batch), batch.completion_mask)
    assert model.config.vocab_size == 25  # the word-level tokenizer of a few sentences
    for row, (prompt, completion) in enumerate(zip(PROMPTS, COMPLETIONS)):
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        ids = prompt_ids + tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        expected = _brute_kl(model, ref, ids, len(prompt_ids))
        n = int(batch.completion_mask[row].sum())
        assert n == len(expected)
        torch.testing.assert_close(kl[row, :n], torch.tensor(expected, dtype=torch.float64), rtol=1e-9, atol=1e-12)
        assert (kl[row, n:] == 0).all()
    assert (kl[batch.completion_mask] > 0).all()


def test_token_kl_is_zero_against_itself_and_never_negative(tiny_lm):
    model, tokenizer = tiny_lm
    batch = completion_batch(tokenizer, PROMPTS, COMPLETIONS)
    with torch.no_grad():
        logits = completion_logits(model, batch)
        others = [completion_logits(_perturbed(model, seed, scale), batch) for seed, scale in ((2, 1.0), (3, 0.01))]
    assert torch.equal(token_kl(logits, logits, batch.completion_mask), torch.zeros(batch.completion_mask.shape,
                                                                                    dtype=logits.dtype))
    for other in others:
        assert (token_kl(logits, other, batch.completion_mask) >= 0).all()
        assert (token_kl(other, logits, batch.completion_mask) >= 0).all()
