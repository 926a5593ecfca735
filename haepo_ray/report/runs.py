"""Trials of sweeps, read back from MLflow: one :class:`Trial` per child run.

A trial's *configuration* is its search-space values without the seed (the tag
``haepo.search_values`` that :mod:`haepo_ray.tracking` writes: spec name -> value); trials of
one experiment and algorithm with the same configuration are seeds of one *group*. Each trial
carries its metric histories, indexed by training iteration.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from haepo_ray import names
from haepo_ray.tracking import TRIAL_ROLE, search_all_runs

ITERATION = names.TRAINING_ITERATION
SECONDS = names.TIME_TOTAL_S
ENV_STEPS = names.ENV_STEPS
RETURN = names.EPISODE_RETURN_MEAN
REGRET = names.REGRET_PER_STEP
SUCCESS = names.SUCCESS_RATE
ENTROPY_KEYS = names.POLICY_ENTROPY_KEYS
CURVE_METRICS = (SECONDS, ENV_STEPS, RETURN, REGRET, SUCCESS, *ENTROPY_KEYS)
ENTROPY = "policy_entropy"
SEED_KEYS = ("seed",)


@dataclass
class Trial:
    """One trial: where it ran, what it tried, and its curves (one row per iteration)."""

    experiment: str
    run_id: str
    algorithm: str
    env: str
    seed: Any
    config: dict[str, Any]  # search values without the seed
    params: dict[str, str]
    curves: pd.DataFrame = field(repr=False)  # index: training_iteration

    @property
    def group(self) -> tuple[str, str, str]:
        """(experiment, algorithm, configuration label): trials that differ only in seed."""
        return self.experiment, self.algorithm, config_label(self.config)

    @property
    def env_label(self) -> str:
        """The env id with its env_config, e.g. ``haepo/ChainMDP-v0 (length=5)``: trials
        with one env label are comparable, whichever sweep ran them."""
        env_config = {k.split("/", 1)[1]: _env_value(v) for k, v in self.params.items()
                      if k.startswith("env_config/")}
        return f"{self.env} ({config_label(env_config)})" if env_config else self.env


def _env_value(value: str) -> str:
    """A long list (a bandit's arm means) as its length and a digest, e.g. ``[10 values #1a2b3c]``."""
    if value.startswith("[") and value.count(",") >= 4:
        return f"[{value.count(',') + 1} values #{hashlib.sha1(value.encode()).hexdigest()[:6]}]"
    return value


def config_label(config: dict[str, Any]) -> str:
    """``batch_size=8, lr=0.001`` (sorted); ``default`` for an empty configuration."""
    return ", ".join(f"{k}={_short(v)}" for k, v in sorted(config.items())) or "default"


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _search_values(run) -> dict[str, Any]:
    """The trial's search values by their names in the spec."""
    raw = run.data.tags.get(names.SEARCH_VALUES)
    if not raw:
        return {}
    try:
        values = json.loads(raw)
    except json.JSONDecodeError:
        return {}
    return {_spec_name(key): value for key, value in values.items()}


def _spec_name(key: str) -> str:
    """A search value's name. Runs logged before the tag held spec names hold Tune's config
    paths ("config/lr", "_train_batch_size_per_learner"): their last part, without RLlib's
    underscore for settings stored behind a property."""
    return key.rsplit("/", 1)[-1].lstrip("_")


def _curves(client, run) -> pd.DataFrame:
    columns: dict[str, pd.Series] = {}
    for key in CURVE_METRICS:
        if key not in run.data.metrics:
            continue
        history = client.get_metric_history(run.info.run_id, key)
        series = pd.Series({m.step: m.value for m in history}, name=key, dtype=float)
        columns[key] = series
    frame = pd.DataFrame(columns).sort_index()
    frame.index.name = ITERATION
    entropy = [k for k in ENTROPY_KEYS if k in frame]
    if entropy:
        frame[ENTROPY] = frame[entropy[0]]
    return frame.drop(columns=list(ENTROPY_KEYS), errors="ignore")


def load_trials(tracking_uri: str, experiments: Iterable[str] | None = None) -> list[Trial]:
    """Every trial of every sweep of ``experiments`` (default: all experiments with sweeps).

    Raises ``LookupError`` naming what is missing when an experiment does not exist or holds
    no sweep.
    """
    from mlflow.tracking import MlflowClient

    if tracking_uri.startswith("sqlite:///") and not Path(tracking_uri[len("sqlite:///"):]).is_file():
        raise LookupError(f"no MLflow store at {tracking_uri} (run a sweep first, or give --tracking-uri)")
    client = MlflowClient(tracking_uri=tracking_uri)
    if experiments:
        exps = []
        for name in experiments:
            exp = client.get_experiment_by_name(name)
            if exp is None:
                known = sorted(e.name for e in client.search_experiments())
                raise LookupError(f"no MLflow experiment {name!r} at {tracking_uri}; there are: {known}")
            exps.append(exp)
    else:
        exps = client.search_experiments()
    trials: list[Trial] = []
    for exp in exps:
        runs = search_all_runs(client, exp.experiment_id, f"tags.`{names.ROLE}` = '{TRIAL_ROLE}'")
        if experiments and not runs:
            raise LookupError(f"MLflow experiment {exp.name!r} at {tracking_uri} holds no sweep trials")
        for run in runs:
            if names.PARENT_RUN not in run.data.tags:
                continue
            values = _search_values(run)
            seed = next((values.pop(k) for k in SEED_KEYS if k in values), run.data.tags.get(names.SEED))
            trials.append(Trial(
                experiment=exp.name,
                run_id=run.info.run_id,
                algorithm=run.data.tags.get(names.ALGORITHM, "?"),
                env=run.data.tags.get(names.ENV, "?"),
                seed=seed,
                config=values,
                params=dict(run.data.params),
                curves=_curves(client, run),
            ))
    return trials

