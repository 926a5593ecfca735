"""Settings an RL run would not read: HAEPO's, GRPO's and DPO's, and what decides each.

A run given a setting it ignores logs a value that changed nothing, and a sweep over it runs
the same trial again and again. ``haepo train --set`` (:mod:`haepo_ray.cli.train`) and an RL
sweep spec (:mod:`haepo_ray.sweep.kinds.rl.plan`) refuse such a setting, as LM runs refuse
theirs (:data:`haepo_ray.llm.settings.READ_WHEN`). ``validate()`` cannot: a config does not
tell a value given from a default, and a checkpoint's config holds every default.
tests/test_rl_unread.py trains each claim both ways and compares the weights.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = ["READ_WHEN", "unread"]


def _is(config: Any, name: str) -> bool:
    """Whether ``config`` is of the baseline ``name`` (``"DPO"``, ``"GRPO"``) or a subclass."""
    from haepo_ray.rl import baselines

    return issubclass(config.algo_class, getattr(baselines, name))


# Setting -> (the settings that decide whether a run reads it, whether a run of this config
# reads it, why one that does not, does not). The algorithm decides too: a spec has one.
READ_WHEN: dict[str, tuple[tuple[str, ...], Callable[[Any], bool], str]] = {
    "reference_update_interval": (
        ("reference_policy",), lambda c: c.reference_policy == "lagged",
        "it is how often the 'lagged' reference policy is refreshed"),
    "beta_kl": (
        ("reference_policy", "num_epochs"), lambda c: c.reference_policy != "behavior" or c.num_epochs > 1,
        "the 'behavior' reference is the policy that sampled the batch, and with one gradient step per batch "
        "(num_epochs 1) that is the policy itself: the KL penalty has zero gradient"),
    "reward_normalization": (
        (), lambda c: not _is(c, "DPO"), "DPO's loss reads only the order of the returns"),
    "clip_param": (
        ("num_epochs",), lambda c: not _is(c, "GRPO") or c.num_epochs > 1,
        "GRPO's ratio to the policy that sampled the batch is 1 at a batch's first gradient step, and with "
        "num_epochs 1 there is no other"),
}


def unread(runs: Sequence[Any], names: Iterable[str]) -> dict[str, str]:
    """Of ``names`` (settings given to ``runs``, the ``AlgorithmConfig`` of one run or of each of a
    sweep's trials), those that no run reads (:data:`READ_WHEN`), each with why and the values that
    decide it; empty when some run reads each."""
    return {name: _why(runs, name) for name in names
            if name in READ_WHEN and all(hasattr(c, name) and not READ_WHEN[name][1](c) for c in runs)}


def _why(runs: Sequence[Any], name: str) -> str:
    deciders, _, reason = READ_WHEN[name]
    if not deciders:
        return reason
    values = {d: " or ".join(dict.fromkeys(repr(getattr(c, d)) for c in runs)) for d in deciders}
    return f"{reason} (here: {', '.join(f'{d} {v}' for d, v in values.items())})"
