"""Which held-out metric each language-model method optimised, and verdicts judged by metrics that
neither of two compared methods optimised.

A method's training signal (:func:`trained_on`): HAEPO, GRPO and DPO on reward-ranked pairs
(``dpo_pairs=reward``) optimise the paper's reward, a weighted sum of token F1, the MiniLM cosine
(semantic similarity) and length closeness against the gold summary (``reward_weights``,
:class:`~haepo_ray.llm.rewards.SummaryReward`), so the reward and each part of non-zero weight
are theirs (:func:`optimised`); DPO on gold pairs (the paper's) learns from the gold summary
itself, preferred to its own samples, and optimises no metric; the SFT start learned the gold
summaries' likelihood. Every method starts from that SFT, so every metric against the gold
favours imitating it; no method computes ROUGE-L or ROUGE-2, the judges of a fair verdict.

:func:`verdicts` compares each pair of methods of a model and data set by every judge of
:data:`~haepo_ray.report.generations.JUDGES` that neither optimised (always ROUGE-L and
ROUGE-2): the first is ahead where its win rate's interval lies above 0.5, behind where it lies
below, else no difference is shown.
"""

from __future__ import annotations

import json
import math

import pandas as pd

from haepo_ray import names
from haepo_ray.report.aggregate import Group
from haepo_ray.report.generations import JUDGES
from haepo_ray.report.interval_cells import interval_text
from haepo_ray.report.llm_results import llm_sections, section_labels
from haepo_ray.report.sft_start import SFT_START

__all__ = ["METRICS", "OPTIMISED_TITLE", "VERDICTS_TITLE", "optimisation_table", "optimised", "trained_on",
           "verdicts"]

# The quality metrics against the gold summary (key in records and eval/*) -> label; the reward's
# parts in the order of reward_weights.
REWARD_PARTS = (names.LLM_TOKEN_F1, names.LLM_SEMANTIC_SIMILARITY, names.LLM_LENGTH_CLOSENESS)
METRICS = {names.LLM_REWARD: "reward", names.LLM_TOKEN_F1: "token F1",
           names.LLM_SEMANTIC_SIMILARITY: "semantic similarity", names.LLM_LENGTH_CLOSENESS: "length closeness",
           names.LLM_ROUGE_L: "ROUGE-L", names.LLM_ROUGE_2: "ROUGE-2"}
_JUDGE_METRIC = {"reward": names.LLM_REWARD}  # a judge's record key -> its metric, where they differ
DEFAULT_WEIGHTS = (1 / 3, 1 / 3, 1 / 3)
NONE = "none of the methods"
OPTIMISED_TITLE = (
    "Language models, which method optimised each held-out metric (all against the gold summary): HAEPO, GRPO "
    "and DPO (dpo_pairs=reward) optimise the reward and its parts of non-zero weight; DPO on gold pairs learns "
    "from the gold summary itself (preferred to its own samples) and the SFT start from its likelihood, which "
    "every metric here rewards indirectly, as every method starts from that SFT; no method computes ROUGE-L or "
    "ROUGE-2")
VERDICTS_TITLE = (
    "Language models, verdict per pair of methods, judged by the metrics neither of the two optimised: the "
    "method's win rate against the opponent on the held-out prompts (ties half; the win rates' intervals), "
    "'ahead' where the interval lies above 0.5, 'behind' where below, else 'no difference shown'")


def _is_reward_trained(g: Group) -> bool:
    return g.algorithm in ("HAEPO", "GRPO") or (g.algorithm == "DPO" and g.config.get("dpo_pairs") == "reward")


def _weights(g: Group) -> tuple[float, ...]:
    """The group's ``reward_weights``: a searched value, else its trials' param of that name,
    else the default."""
    value = g.config.get("reward_weights")
    if value is None:
        value = next((v for k, v in g.trials[0].params.items() if k.rsplit("/", 1)[-1] == "reward_weights"), None)
    if isinstance(value, str):
        try:
            value = json.loads(value.replace("(", "[").replace(")", "]"))
        except json.JSONDecodeError:
            value = None
    return tuple(float(w) for w in value) if value is not None and len(value) == 3 else DEFAULT_WEIGHTS


def optimised(g: Group) -> set[str]:
    """The metrics (keys of :data:`METRICS`) the group's method optimised in training."""
    if not _is_reward_trained(g):
        return set()
    return {names.LLM_REWARD} | {part for part, w in zip(REWARD_PARTS, _weights(g), strict=True) if w > 0}


def trained_on(g: Group) -> str:
    """What the group's method learned from, in words."""
    if g.algorithm == SFT_START:
        return "the gold summaries' likelihood (SFT)"
    if _is_reward_trained(g):
        parts = " + ".join(f"{w:.3g} {METRICS[p]}" for p, w in zip(REWARD_PARTS, _weights(g), strict=True) if w > 0)
        return f"the reward: {parts}"
    if g.algorithm == "DPO":
        return "the gold summary, preferred to its own samples"
    return "?"


def optimisation_table(groups: list[Group]) -> pd.DataFrame:
    """Per model and data set and metric of :data:`METRICS`: the methods that optimised it
    (:data:`NONE` where none did); then per method what it learned from."""
    rows = []
    for members in llm_sections(groups).values():
        subject, label = members[0].trials[0].subject, section_labels(members)
        for metric, name in METRICS.items():
            by = [label[id(g)] for g in members if metric in optimised(g)]
            rows.append({**subject, "metric or method": name, "optimised by / trained on": ", ".join(by) or NONE})
        rows += [{**subject, "metric or method": label[id(g)], "optimised by / trained on": trained_on(g)}
                 for g in members]
    return pd.DataFrame(rows)


def _verdict(rate) -> str:
    if rate.n == 0 or math.isnan(rate.mean):
        return ""
    if rate.n > 1 and rate.low > 0.5:
        return "ahead"
    if rate.n > 1 and rate.high < 0.5:
        return "behind"
    return "no difference shown"


def verdicts(groups: list[Group], rates: pd.DataFrame) -> pd.DataFrame:
    """Per model and data set and ordered pair of methods in ``rates`` (:func:`~haepo_ray.report.
    llm_results.win_rates`): the verdict by each judge neither optimised, with its win rate; and
    the win rates by the judges one of them optimised, marked with who did."""
    if rates.empty:
        return pd.DataFrame()
    rows = []
    for members in llm_sections(groups).values():
        label = section_labels(members)
        by_label = {label[id(g)]: g for g in members}
        subject = members[0].trials[0].subject
        part = rates[rates[list(subject)].eq(pd.Series(subject)).all(axis=1)] if len(subject) else rates
        for (ours, theirs), pair in part.groupby(["method", "opponent"], sort=True):
            if ours not in by_label or theirs not in by_label:
                continue
            trainers = {m: [x for x in (ours, theirs) if m in optimised(by_label[x])] for m in METRICS}
            fair, other = [], []
            for judge, rate in zip(pair["judge"], pair["win rate"], strict=True):
                metric = _JUDGE_METRIC.get(JUDGES[judge], JUDGES[judge])
                if not trainers.get(metric):
                    if verdict := _verdict(rate):
                        fair.append(f"{judge}: {verdict} ({interval_text(rate)})")
                else:
                    other.append(f"{judge} (optimised by {' and '.join(trainers[metric])}): {interval_text(rate)}")
            if fair:
                rows.append({**subject, "method": ours, "opponent": theirs,
                             "verdict by metrics neither optimised": "; ".join(fair),
                             "win rate by metrics one optimised": "; ".join(other)})
    return pd.DataFrame(rows)
