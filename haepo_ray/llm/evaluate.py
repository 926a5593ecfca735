"""The held-out evaluation of a language-model run: what the paper's quality claims are read from.

The ``eval_prompts`` held-out prompts (:func:`~haepo_ray.llm.data.split_examples`: no SFT or RL
example has their source text) get a greedy completion each and ``eval_samples`` sampled at
``temperature``, ``eval_batch`` prompts per generation call (sampled from the seed of update 0,
which no training update has, at the call's first prompt: the same at every evaluation and for
every algorithm). Each set's means over its completions are :data:`haepo_ray.names.LLM_EVAL_METRICS`:
``reward_mean``, the reward's parts ``token_f1``, ``semantic_similarity`` (its cosine part) and
``length_closeness``, ``rouge_l``, ``completion_length`` and ``profanity_rate``.

The KL to the reference (``policy``: :data:`haepo_ray.names.LLM_EVAL_POLICY_METRICS`): each
prompt gets ``kl_samples`` completions sampled from the policy itself, temperature 1 (the
distribution whose log-probs the losses use) and EOS allowed from the first token (no
``min_new_tokens``), from the seed of update -1 (no other sampling has it). On each, the exact
per-token KL(pi || pi_ref) over the vocabulary (:meth:`~haepo_ray.llm.policy.Policy.exact_kl`)
summed over its positions: by the chain rule an unbiased estimate of the KL between the two
policies' distributions of completions (up to ``max_new_tokens`` tokens) that, unlike the
log-ratio L_k - L_k^ref of one sample, is never negative. ``kl_exact`` is its mean per prompt
over the samples (in each prompt's record), then over prompts; ``completion_length`` that of
these samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from haepo_ray import names
from haepo_ray.llm.data import Example, format_prompt, shown_source
from haepo_ray.llm.distributed import sample_seed
from haepo_ray.llm.objectives import chunks
from haepo_ray.llm.policy import Policy
from haepo_ray.llm.rewards import RewardFn, check_rewards, completion_scores, profanity_rate
from haepo_ray.llm.rollout import Batch, generate, sample_groups
from haepo_ray.llm.settings import LLMTrainSettings

__all__ = ["evaluate"]


def evaluate(settings: LLMTrainSettings, policy: Policy, tokenizer: Any, reward_fn: RewardFn,
             held_out: Sequence[Example]) -> tuple[dict[str, dict[str, float]], list[dict[str, Any]]]:
    """(``{"greedy": means, "sampled": means, "policy": KL means}``, one record per prompt: its
    id, source, gold reference, the model's input (``instruction`` and ``shown_source``, the
    source as cut to ``max_source_words``), greedy completion and its scores, the prompt's
    exact KL ``kl_exact``, algorithm, model and seed)."""
    s, model = settings, policy.model
    scores: dict[str, dict[str, list[float]]] = {mode: {} for mode in names.LLM_EVAL_MODES}
    texts: dict[str, list[str]] = {mode: [] for mode in names.LLM_EVAL_MODES}
    records = []
    kl: dict[str, list[float]] = {names.LLM_EXACT_KL: [], names.LLM_COMPLETION_LENGTH: []}
    for c in chunks(len(held_out), s.eval_batch):
        chosen = held_out[c]
        prompts = [format_prompt(e, tokenizer, s.max_source_words) for e in chosen]
        positions = range(c.start, c.stop)
        seeds = [sample_seed(s.seed, 0, i) for i in positions]
        with policy.autocast():
            completions = {
                "greedy": (*generate(model, tokenizer, prompts, group_size=1, max_new_tokens=s.max_new_tokens,
                                     min_new_tokens=1, greedy=True, decoding=s.decoding), chosen),
                "sampled": (*sample_groups(model, tokenizer, prompts, seeds, positions, group_size=s.eval_samples,
                                           max_new_tokens=s.max_new_tokens, min_new_tokens=s.min_new_tokens,
                                           temperature=s.temperature, together=True, decoding=s.decoding),
                            [e for e in chosen for _ in range(s.eval_samples)]),
            }
            own, _ = sample_groups(model, tokenizer, prompts, [sample_seed(s.seed, -1, i) for i in positions],
                                   positions, group_size=s.kl_samples, max_new_tokens=s.max_new_tokens,
                                   min_new_tokens=1, temperature=1.0, together=True, decoding=s.decoding)
        prompt_kl = policy.exact_kl(own).view(len(chosen), s.kl_samples).mean(1).tolist()
        kl[names.LLM_EXACT_KL] += prompt_kl
        kl[names.LLM_COMPLETION_LENGTH] += own.completion_mask.sum(1).tolist()
        for mode, (batch, mode_texts, examples) in completions.items():
            chunk_scores = _scores(reward_fn, batch, mode_texts, examples)
            if mode == "greedy":
                records += [{"prompt_id": e.prompt_id, "source": e.source, "reference": e.reference,
                             "instruction": e.instruction, "shown_source": shown_source(e, s.max_source_words),
                             "completion": mode_texts[i], "reward": chunk_scores[names.LLM_REWARD][i],
                             **{k: v[i] for k, v in chunk_scores.items() if k != names.LLM_REWARD},
                             names.LLM_EXACT_KL: prompt_kl[i], "algorithm": s.algo, "model": s.model, "seed": s.seed}
                            for i, e in enumerate(examples)]
            texts[mode] += mode_texts
            for key, values in chunk_scores.items():
                scores[mode].setdefault(key, []).extend(values)
    means = {mode: {**{k: sum(v) / len(v) for k, v in scores[mode].items()},
                    names.LLM_PROFANITY_RATE: profanity_rate(texts[mode])}
             for mode in names.LLM_EVAL_MODES}
    means[names.LLM_EVAL_POLICY] = {k: sum(v) / len(v) for k, v in kl.items()}
    return means, records


def _scores(reward_fn: RewardFn, batch: Batch, texts: list[str], examples: Sequence[Example]) -> dict[str, list[float]]:
    """Per completion of ``batch``: the reward, its parts and ROUGE-L, and the length in tokens
    (EOS included)."""
    return {names.LLM_REWARD: check_rewards(reward_fn(texts, examples), texts),
            **completion_scores(texts, [e.reference for e in examples]),
            names.LLM_COMPLETION_LENGTH: batch.completion_mask.sum(1).tolist()}
