"""The held-out evaluation of a language-model run: what the paper's quality claims are read from.

The ``eval_prompts`` held-out prompts (:func:`~haepo_ray.llm.data.split_examples`: no SFT or RL
example has their source text) get a greedy completion each and ``eval_samples`` sampled at
``temperature``, ``eval_batch`` prompts per generation call (sampled from the seed of update 0,
which no training update has, at the call's first prompt: the same at every evaluation and for
every algorithm). Each set's means over its completions are :data:`haepo_ray.names.LLM_EVAL_METRICS`:
``reward_mean``, the reward's parts ``token_f1``, ``semantic_similarity`` (its cosine part) and
``length_closeness``, ``rouge_l``, ``completion_length``, ``profanity_rate`` and ``kl`` (the
training row's estimate L_k - L_k^ref on these completions; for greedy ones the log-ratio, not
an unbiased estimate).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from haepo_ray import names
from haepo_ray.llm.data import Example, format_prompt
from haepo_ray.llm.distributed import sample_seed
from haepo_ray.llm.objectives import chunks
from haepo_ray.llm.policy import Policy
from haepo_ray.llm.rewards import RewardFn, check_rewards, completion_scores, profanity_rate
from haepo_ray.llm.rollout import Batch, generate, sample_groups, sequence_kl
from haepo_ray.llm.settings import LLMTrainSettings

__all__ = ["evaluate"]


def evaluate(settings: LLMTrainSettings, policy: Policy, tokenizer: Any, reward_fn: RewardFn,
             held_out: Sequence[Example]) -> tuple[dict[str, dict[str, float]], list[dict[str, Any]]]:
    """(``{"greedy": means, "sampled": means}``, one record per greedy completion: prompt id,
    source, gold reference, completion, its scores, algorithm, model and seed)."""
    s, model = settings, policy.model
    scores: dict[str, dict[str, list[float]]] = {mode: {} for mode in names.LLM_EVAL_MODES}
    texts: dict[str, list[str]] = {mode: [] for mode in names.LLM_EVAL_MODES}
    records = []
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
        for mode, (batch, mode_texts, examples) in completions.items():
            chunk_scores = _scores(policy, reward_fn, batch, mode_texts, examples)
            if mode == "greedy":
                records += [{"prompt_id": e.prompt_id, "source": e.source, "reference": e.reference,
                             "completion": mode_texts[i], "reward": chunk_scores[names.LLM_REWARD][i],
                             **{k: v[i] for k, v in chunk_scores.items() if k != names.LLM_REWARD},
                             "algorithm": s.algo, "model": s.model, "seed": s.seed}
                            for i, e in enumerate(examples)]
            texts[mode] += mode_texts
            for key, values in chunk_scores.items():
                scores[mode].setdefault(key, []).extend(values)
    means = {mode: {**{k: sum(v) / len(v) for k, v in scores[mode].items()},
                    names.LLM_PROFANITY_RATE: profanity_rate(texts[mode])}
             for mode in names.LLM_EVAL_MODES}
    return means, records


def _scores(policy: Policy, reward_fn: RewardFn, batch: Batch, texts: list[str],
            examples: Sequence[Example]) -> dict[str, list[float]]:
    """Per completion of ``batch``: the reward, its parts and ROUGE-L, the length in tokens
    (EOS included) and the KL estimate L_k - L_k^ref."""
    mask = batch.completion_mask
    logp, ref_logp = policy.logp(batch), policy.reference_logp(batch)
    kl = sequence_kl(logp, logp if ref_logp is None else ref_logp, mask)  # reference none: KL 0
    return {names.LLM_REWARD: check_rewards(reward_fn(texts, examples), texts),
            **completion_scores(texts, [e.reference for e in examples]),
            names.LLM_COMPLETION_LENGTH: mask.sum(1).tolist(),
            names.LLM_KL: kl.tolist()}
