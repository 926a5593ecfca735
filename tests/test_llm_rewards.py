"""The paper's summary reward and the evaluation metrics against hand-computed cases."""

from __future__ import annotations

import math

import pytest

from haepo_ray.llm.data import Example
from haepo_ray.llm.rewards import (
    SummaryReward,
    check_rewards,
    length_closeness,
    profanity_rate,
    rouge_l,
    semantic_similarity,
    summary_metrics,
    token_f1,
)

GOLD = "the cat sat on the mat"


def test_token_f1():
    # 3 shared words: precision 3/3, recall 3/6 -> F1 = 2/3
    assert token_f1("The cat, sat", GOLD) == pytest.approx(2 / 3)
    assert token_f1("the the the", "the cat") == pytest.approx(0.4)  # overlap 1: P 1/3, R 1/2
    assert token_f1("dog", "cat") == 0.0
    assert token_f1("", "") == 1.0 and token_f1("", "cat") == 0.0


def test_length_closeness():
    assert length_closeness("a b", "a b c d") == 0.5
    assert length_closeness("a b c d", "a b") == 0.5
    assert length_closeness("x y z", "a b c") == 1.0
    assert length_closeness("", "a") == 0.0 and length_closeness("", "") == 1.0


def test_rouge_l():
    # LCS "the cat sat" = 3: precision 1, recall 1/2 -> F = 2/3
    assert rouge_l("the cat sat", GOLD) == pytest.approx(2 / 3)
    assert rouge_l("mat the on", GOLD) == pytest.approx(2 * (2 / 3) * (2 / 6) / (2 / 3 + 2 / 6))  # LCS "the mat"/"on the" = 2
    assert rouge_l("dog", GOLD) == 0.0


def test_profanity_rate():
    assert profanity_rate(["hello there", "what the fuck", "shit happens", "nice paper"]) == 0.5
    assert profanity_rate([]) == 0.0


def test_semantic_similarity_orders_meaning():
    same, related, unrelated = semantic_similarity(
        [GOLD, "a cat was sitting on a rug", "stock prices fell sharply today"], [GOLD] * 3)
    assert same == pytest.approx(1.0, abs=1e-5)
    assert related > 0.5 > unrelated


def test_summary_reward_is_the_weighted_sum():
    examples = [Example("p", "i", "s", GOLD)]
    assert SummaryReward(f1=1, semantic=0, length=0)(["the cat sat"], examples) == [pytest.approx(2 / 3)]
    assert SummaryReward(f1=1, semantic=0, length=2)(["the cat sat"], examples) == [pytest.approx(2 / 3 + 2 * 0.5)]
    (full,) = SummaryReward()([GOLD], examples)
    assert full == pytest.approx(1.0, abs=1e-5)  # F1 1, cosine 1, length 1, weights 1/3 each
    with pytest.raises(ValueError, match="reward weights must be finite, >= 0 and not all 0"):
        SummaryReward(0, 0, 0)
    with pytest.raises(ValueError, match="reward weights"):
        SummaryReward(f1=-1)



def test_reward_weights_are_those_of_the_parts_its_help_names_in_that_order():
    """``reward_weights`` goes positionally into :class:`SummaryReward`; its help names the parts
    computed, in that order (no ROUGE-L or profanity term: those are metrics)."""
    from haepo_ray.llm.settings import HELP, LLMTrainSettings

    examples = [Example("p", "i", "s", GOLD)]
    parts = {"token F1": token_f1, "cosine": lambda c, r: semantic_similarity([c], [r])[0],
             "length closeness": length_closeness}
    for i, (part, score) in enumerate(parts.items()):
        weights = LLMTrainSettings(reward_weights=tuple(float(j == i) for j in range(3))).reward_weights
        assert SummaryReward(*weights)(["the cat"], examples) == [pytest.approx(score("the cat", GOLD))], part
    text = HELP["reward_weights"]
    assert sorted(parts, key=text.find) == list(parts) and all(p in text for p in parts), text
    assert "ROUGE" not in text and "profan" not in text, text

def test_summary_metrics():
    metrics = summary_metrics(["the cat sat", "shit"], [GOLD, GOLD])
    assert metrics["rouge_l"] == pytest.approx((2 / 3 + 0) / 2)
    assert metrics["profanity_rate"] == 0.5
    assert 0 < metrics["semantic_similarity"] < 1
    with pytest.raises(ValueError, match="need as many references as completions"):
        summary_metrics(["a"], [])


def test_nan_reward_and_wrong_count_are_clear_errors():
    assert check_rewards([1, 0.5], ["a", "b"]) == [1.0, 0.5]
    with pytest.raises(ValueError, match=r"reward of completion 1 is nan \(completion: 'b'\)"):
        check_rewards([1.0, math.nan], ["a", "b"])
    with pytest.raises(ValueError, match="reward of completion 0 is inf"):
        check_rewards([math.inf], ["a"])
    with pytest.raises(ValueError, match="returned 1 rewards for 2 completions"):
        check_rewards([1.0], ["a", "b"])
