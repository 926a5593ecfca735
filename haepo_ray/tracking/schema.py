"""What a sweep writes to MLflow, in which form; the report reads it back the same way.

- Tags: the names in :mod:`haepo_ray.names`; :data:`SWEEP_ROLE` / :data:`TRIAL_ROLE` are the
  values of ``haepo.role`` on a parent and a child run, :data:`TRAIN_ROLE` on a ``haepo train``
  run; :func:`result_tags` are those a result gives its run.
- Params: a config flattened with ``/`` (:func:`flatten`), keys made valid (:func:`sanitize_key`),
  values as text (:func:`param_value`).
- Metrics: the numeric values of a result whose flattened keys match the globs of
  :data:`DEFAULT_METRICS` (:func:`select_metrics`), without values carried over from an earlier
  iteration.
- The best trial: the best *last* reported value of the sweep's metric (Tune's
  ``scope="last"``); :func:`rank` is the one rule, used by the parent run's summary and by the
  sweep's printed and saved results.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from haepo_ray import names

SWEEP_ROLE = "sweep"
TRIAL_ROLE = "trial"
TRAIN_ROLE = "train"  # a run of ``haepo train``: no parent

# Result keys logged every iteration (glob patterns over the "/"-flattened result).
_EPISODE_METRICS = (names.EPISODE_RETURN_MEAN, names.EPISODE_RETURN_MIN, names.EPISODE_RETURN_MAX,
                    names.EPISODE_LEN_MEAN, names.REGRET_PER_STEP, names.SUCCESS_RATE)
DEFAULT_METRICS = (
    names.TRAINING_ITERATION,
    names.TIME_TOTAL_S,
    names.TIME_THIS_ITER_S,
    "num_env_steps_sampled_lifetime",  # RLlib's top-level count, next to the env runners' one
    names.ENV_STEPS,
    names.EPISODES,
    *_EPISODE_METRICS,
    *(f"{names.EVALUATION}/{key}" for key in _EPISODE_METRICS),  # where the config evaluates
    "learners/*",
)

# The same for language-model trials (haepo_ray.sweep.kinds.llm.trainable): every value of the
# update's metric row, the held-out evaluation's "eval/<mode>/<metric>" (names.llm_eval) included.
LLM_METRICS = (
    names.LLM_UPDATE,
    names.LLM_TRAIN_TIME,
    names.TIME_TOTAL_S,
    names.LLM_REWARD,
    names.LLM_ROUGE_L,
    names.LLM_SEMANTIC_SIMILARITY,
    names.LLM_PROFANITY_RATE,
    names.LLM_COMPLETION_LENGTH,
    names.LLM_EFFECTIVE_NUM_TRAJECTORIES,
    names.LLM_KL,
    names.LLM_LOSS,
    names.LLM_UPDATE_TIME,
    names.LLM_FLOAT16_OVERFLOWS,  # float16 mixed precision only
    f"{names.LLM_PHASE_TIME}/*",
    f"{names.LLM_PEAK_MEMORY}/*",
    f"{names.LLM_PEAK_RESERVED_MEMORY}/*",
    *names.llm_eval_keys(),
    *names.llm_eval_keys(names.LLM_EVAL_START),
)

# MLflow's limits: items per log_batch call, lengths of values and keys.
MAX_PARAMS_PER_BATCH = 100
MAX_TAGS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000  # (also the most items of all kinds in one call)
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 5000
MAX_KEY = 250

_BAD_KEY_CHARS = re.compile(r"[^A-Za-z0-9_\-. /]")


def flatten(data: Mapping[str, Any], prefix: str = "", sep: str = "/") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a/b": 1}`` (an empty mapping stays a value)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name, sep))
        else:
            out[name] = value
    return out


def sanitize_key(key: str) -> str:
    """A valid MLflow key (letters, digits, ``_-. /``), at most 250 characters."""
    return _BAD_KEY_CHARS.sub("_", key)[:MAX_KEY]


def param_value(value: Any) -> str:
    """A param's text: classes and functions by their dotted name (not their repr, which holds
    a memory address that differs between the first run of a sweep and its resumption)."""
    if isinstance(value, type):
        text = f"{value.__module__}.{value.__qualname__}"
    elif callable(value) and hasattr(value, "__qualname__"):
        text = f"{getattr(value, '__module__', '')}.{value.__qualname__}"
    else:
        text = str(value)
    return text[:MAX_PARAM_VALUE]


def params_of(config: Mapping[str, Any]) -> dict[str, str]:
    """MLflow params of a (nested) config: flattened keys, made valid, values as text."""
    return {sanitize_key(k): param_value(v) for k, v in flatten(config).items()}


def tag_values(tags: Mapping[str, Any]) -> dict[str, str]:
    """Tags as MLflow stores them: text, cut to its length limit."""
    return {k: str(v)[:MAX_TAG_VALUE] for k, v in tags.items()}


def result_tags(result: Mapping[str, Any]) -> dict[str, str]:
    """The tags a result gives its run: the Ray node (ip, host name), the provenance it
    carries (:data:`~haepo_ray.names.PROVENANCE`) and the trial's own tags
    (:data:`~haepo_ray.names.RUN_TAGS`)."""
    return {names.NODE_IP: str(result.get("node_ip", "")), names.HOSTNAME: str(result.get("hostname", "")),
            **(result.get(names.PROVENANCE) or {}), **(result.get(names.RUN_TAGS) or {})}


def is_metric_value(value: Any) -> bool:
    """A number MLflow can log: int or float (numpy scalars included), not bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) or (
        hasattr(value, "dtype") and getattr(value, "shape", None) == () and value.dtype.kind in "iuf"
    )


def select_metrics(result: Mapping[str, Any], patterns: Iterable[str]) -> dict[str, float]:
    """Numeric values of the flattened ``result`` whose keys match any glob in ``patterns``,
    without the values carried over from an earlier iteration (the keys named under
    :data:`~haepo_ray.names.CARRIED_OVER`, and the keys below them)."""
    carried = tuple(result.get(names.CARRIED_OVER) or ())
    below_carried = tuple(f"{c}/" for c in carried)
    flat = flatten({k: v for k, v in result.items() if k not in ("config", names.CARRIED_OVER)})
    pats = list(patterns)
    out: dict[str, float] = {}
    for key, value in flat.items():
        if key in carried or key.startswith(below_carried):
            continue
        if is_metric_value(value) and any(fnmatch.fnmatchcase(key, p) for p in pats):
            out[sanitize_key(key)] = float(value)
    return out


# --------------------------------------------------------------------------- the best trial

T = TypeVar("T")


def metric_value(result: Mapping[str, Any] | None, metric: str | None) -> float | None:
    """``metric`` (a "/"-flattened key) in a nested or flattened result; None when it is
    missing, not a number, or NaN."""
    value = flatten(result or {}).get(metric) if metric else None
    if not is_metric_value(value) or math.isnan(value):
        return None
    return float(value)


def rank(items: Iterable[T], value: Callable[[T], float | None], mode: str) -> list[T]:
    """``items`` best first by ``value`` (highest for ``mode="max"``, lowest for ``"min"``;
    ties keep their order), then those without a value, in their order."""
    items = list(items)
    scored = [i for i in items if value(i) is not None]
    rest = [i for i in items if value(i) is None]
    return sorted(scored, key=value, reverse=mode == "max") + rest


def best(items: Iterable[T], value: Callable[[T], float | None], mode: str) -> T | None:
    """The first of :func:`rank`, or None when no item has a value."""
    ranked = rank(items, value, mode)
    return ranked[0] if ranked and value(ranked[0]) is not None else None


def summarize_trials(trials: Iterable[Any], metric: str | None, mode: str = "max") -> dict[str, Any]:
    """The parent run's ``summary.json``: the number of Tune trials and the best one by the
    last reported value of ``metric``."""
    rows = [{"trial_id": t.trial_id, "value": metric_value(getattr(t, "last_result", None), metric)}
            for t in trials]
    top = best(rows, lambda r: r["value"], mode)
    return {"num_trials": len(rows), "best": top, "metric": metric, "mode": mode}
