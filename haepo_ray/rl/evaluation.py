"""Which training iterations RLlib evaluated in.

``Algorithm.step`` evaluates in the iterations that are a multiple of ``evaluation_interval``
(or of ``offline_evaluation_interval``), but the result of every iteration after the first
evaluation holds the ``evaluation`` block: its metrics logger reports the last evaluation's
values again. :func:`mark_stale_evaluation` names that block under
:data:`~haepo_ray.names.CARRIED_OVER` in an iteration that did not evaluate, so MLflow logs each
evaluation once, at the iteration it ran in; Tune's metric still sees the carried value.
"""

from __future__ import annotations

from typing import Any

from haepo_ray import names


INTERVALS = ("evaluation_interval", "offline_evaluation_interval")  # the settings that make RLlib evaluate


def evaluates(config: Any) -> bool:
    """Whether ``config`` evaluates in any iteration."""
    return any(getattr(config, name) for name in INTERVALS)


def evaluated(iteration: int, config: Any) -> bool:
    """Whether ``Algorithm.step`` evaluated in training iteration ``iteration`` (1-based)."""
    return any((interval := getattr(config, name)) and iteration % interval == 0 for name in INTERVALS)


def mark_stale_evaluation(result: dict[str, Any], config: Any) -> dict[str, Any]:
    """``result``, its ``evaluation`` block named carried over where its iteration did not evaluate."""
    iteration = result.get(names.TRAINING_ITERATION)
    if names.EVALUATION in result and isinstance(iteration, int) and not evaluated(iteration, config):
        result[names.CARRIED_OVER] = [*result.get(names.CARRIED_OVER, ()), names.EVALUATION]
    return result
