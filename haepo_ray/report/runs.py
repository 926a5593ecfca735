"""Trials of sweeps, read back from MLflow: one :class:`Trial` per child run.

A trial's *configuration* is its search-space values without the seed (the tag
``haepo.search_values`` that :mod:`haepo_ray.tracking` writes: spec name -> value); trials of
one experiment and algorithm with the same configuration are seeds of one *group*. Each trial
carries its metric histories, indexed by its step: the training iteration of an RL trial, the
RL update of a language-model trial (tag ``haepo.model``; :mod:`~haepo_ray.report.kinds`), and
its run's status: only ``FINISHED`` runs ran to their end (failed, killed and still running
ones, and seeds that a later sweep repeated, are :mod:`~haepo_ray.report.status`'s business).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from haepo_ray import names
from haepo_ray.report.generations import Scores, read_scores
from haepo_ray.report.histories import History, read_histories
from haepo_ray.report.kinds import ENTROPY, HAEPO, LLM, RL, Kind
from haepo_ray.report.records import RunRecord, trial_runs
from haepo_ray.tracking import TRAIN_ROLE, TRIAL_ROLE, experiment_named, open_store

ITERATION = names.TRAINING_ITERATION
SECONDS = names.TIME_TOTAL_S
ENV_STEPS = names.ENV_STEPS
RETURN = names.EPISODE_RETURN_MEAN
REGRET = names.REGRET_PER_STEP
SUCCESS = names.SUCCESS_RATE
ENTROPY_KEYS = names.POLICY_ENTROPY_KEYS
SEED_KEYS = ("seed",)
FINISHED = "FINISHED"
# A kind's first step, where it is known: an RL trial's steps are its results' training_iteration,
# which Tune sets to 1 in a trial's first result and counts up, so a metric whose latest step is 1
# (MLflow's latest: of the highest step) has no other step, and its latest value is its history
# (MLflow's latest of one step and the history's last value both are the latest logged, of those
# the largest). A language-model trial's first update is not fixed: its histories are read.
FIRST_STEP = {RL.step: 1}
# Search values a language-model trial's tags already name (its algorithm, model and data set:
# a sweep over algorithms has "algorithm" in its search space); not part of its configuration,
# except the settings of a method (an "algorithm" value {"algo": "HAEPO", "length_normalize": true}:
# haepo_ray.sweep.kinds.llm.plan), which are.
LLM_TAGGED_KEYS = ("algorithm", "model", "data")


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
    curves: pd.DataFrame = field(repr=False)  # index: the kind's step
    model: str | None = None  # language-model trials: the model and the data set
    data: str | None = None
    status: str = FINISHED  # the MLflow run's: FINISHED, FAILED, KILLED, RUNNING, SCHEDULED
    sweep: str = ""  # the sweep that ran it (tag haepo.sweep: its name and start)
    error: str = ""  # the trial's error (tag haepo.error), when it failed
    provenance: dict[str, str] = field(default_factory=dict)  # tags of haepo_ray.provenance
    # language-model trials with generations: their last evaluation's scores per prompt
    scores: Scores = field(default_factory=dict, repr=False)
    start_scores: Scores = field(default_factory=dict, repr=False)  # its SFT start's evaluation's (update 0)

    @property
    def finished(self) -> bool:
        """The trial ran to its end (its stop criterion, its scheduler's decision)."""
        return self.status == FINISHED

    @property
    def kind(self) -> Kind:
        return LLM if self.model is not None else RL

    @property
    def method(self) -> str:
        """What the report calls the trial's method (:func:`method_name`)."""
        return method_name(self.algorithm, config_label(self.config))

    @property
    def group(self) -> tuple[str, str, str, str]:
        """(experiment, algorithm, model, configuration label): trials that differ only in
        seed (the model is empty for RL trials)."""
        return self.experiment, self.algorithm, self.model or "", config_label(self.config)

    def reads(self, metric: str) -> bool:
        """Whether the trial's curves hold ``metric``: not one of HAEPO's weights
        (:attr:`Kind.haepo_only`) in another algorithm's trial, which logs the weights HAEPO
        would give its samples, a property of neither."""
        return metric not in self.kind.haepo_only or self.algorithm == HAEPO

    @property
    def subject(self) -> dict[str, str]:
        """What a language-model trial trained (model, data set), as table columns; empty for RL."""
        return {key: getattr(self, key) or "?" for key in self.kind.subject}

    @property
    def section(self) -> str:
        """Where the report shows the trial: trials with one section are comparable, the RL
        ones by :attr:`env_label`, the language-model ones by model and data set."""
        if self.kind is RL:
            return self.env_label
        return f"{self.model} on {self.data}" if self.data else str(self.model)

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


def method_name(algorithm: str, label: str) -> str:
    """``HAEPO``, or with a configuration (``label``: :func:`config_label`) ``HAEPO
    (length_normalize=True)``: a method's name in the report and on the human-evaluation forms."""
    return algorithm if label == "default" else f"{algorithm} ({label})"


def run_config_label(run) -> str:
    """The :func:`config_label` of a trial's MLflow child run (its search values but the seed)."""
    return config_label(_trial("", RunRecord.of(run)).config)


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _search_values(run: RunRecord) -> dict[str, Any]:
    """The trial's search values by their names in the spec."""
    raw = run.tags.get(names.SEARCH_VALUES)
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


def curve_keys(metrics: Iterable[str], kind: Kind) -> list[str]:
    """The keys of ``metrics`` (a run's metric keys) that ``kind``'s curves read, in their order."""
    return [k for k in metrics if k in kind.metrics or any(k.startswith(p) for p in kind.prefixes)]


def curves(histories: Mapping[str, History], keys: Iterable[str], kind: Kind) -> pd.DataFrame:
    """A run's curves of its metrics ``keys`` (:func:`curve_keys`), one row per step, from its
    ``histories`` (:mod:`~haepo_ray.report.histories`: a step logged twice, as by a restarted
    trial, keeps its last value). Derived columns: RL's one entropy of RLlib's two names, and a
    language-model trial's peak memory over its phases. Built from arrays in one go: 10,000
    trials take seconds, not minutes."""
    keys = list(keys)
    steps = sorted({step for key in keys for step in histories.get(key, {})})
    values = {key: np.array([histories.get(key, {}).get(step, np.nan) for step in steps], dtype=float)
              for key in keys}
    columns = {key: column for key, column in values.items() if key not in ENTROPY_KEYS}
    entropy = [values[k] for k in ENTROPY_KEYS if k in values]
    if entropy:
        columns[ENTROPY] = entropy[0]
    phases = [column for key, column in values.items() if key.startswith(LLM.prefixes)]
    if phases:
        columns[names.LLM_PEAK_MEMORY] = np.fmax.reduce(phases)
    index = pd.Index(steps, dtype="int64", name=kind.step)
    if not columns:
        return pd.DataFrame(index=index)
    # one 2-D block: a third faster than pandas' own from a dict, which 10,000 trials pay for
    return pd.DataFrame(np.column_stack(list(columns.values())), index=index, columns=list(columns))


def one_step(run: RunRecord, keys: Iterable[str], kind: Kind) -> dict[str, History]:
    """The histories of the metrics ``keys`` of ``run`` whose latest value is at ``kind``'s
    first step (:data:`FIRST_STEP`): that value, their only one."""
    first = FIRST_STEP.get(kind.step)
    return {key: {first: run.latest[key][1]} for key in keys
            if first is not None and key in run.latest and run.latest[key][0] == first}


def _trial(experiment: str, run: RunRecord) -> Trial:
    """The trial of a child run, without its curves: its tags say its kind, algorithm, subject
    and seed."""
    tags = run.tags
    values = _search_values(run)
    seed = next((values.pop(k) for k in SEED_KEYS if k in values), tags.get(names.SEED))
    model = tags.get(names.MODEL)
    if model is not None:
        method = values.get("algorithm")
        values = {k: v for k, v in values.items() if k not in LLM_TAGGED_KEYS}
        if isinstance(method, dict):
            values |= {k: v for k, v in method.items() if k != "algo"}
    return Trial(experiment=experiment, run_id=run.run_id, algorithm=tags.get(names.ALGORITHM, "?"),
                 env=tags.get(names.ENV, "?"), seed=seed, config=values, params=run.params,
                 curves=pd.DataFrame(), model=model, data=tags.get(names.DATA), status=run.status,
                 sweep=tags.get(names.SWEEP, ""),
                 error=tags.get(names.ERROR, ""),
                 provenance={k: v for k, v in tags.items() if k.startswith(names.PROVENANCE_PREFIXES)})


def _train_runs_note(client, exps: list) -> str:
    """What a store without sweep trials says of the runs of ``haepo train`` in ``exps``."""
    count = sum(len(trial_runs(client, exp.experiment_id, names.ROLE, TRAIN_ROLE)) for exp in exps)
    return (f"; it holds {count} runs of haepo train, which are not sweep trials: the report compares the "
            "trials of sweeps (haepo sweep)") if count else ""


def load_trials(tracking_uri: str, experiments: Iterable[str] | None = None) -> list[Trial]:
    """Every trial of every sweep of ``experiments`` (default: all experiments with sweeps),
    each experiment's latest start first (as :func:`trial_runs` gives them).

    Raises ``LookupError`` naming what is missing when an experiment does not exist or holds
    no sweep, or when no trial is found (naming ``haepo train``'s runs there, which are not
    trials). The runs are read as records (:func:`trial_runs`), the curves of all trials in
    batches (:func:`read_histories`) except those of one step (:func:`one_step`), the scores of
    language-model trials from their generations (:func:`read_scores`).
    """
    client = open_store(tracking_uri)
    exps = ([experiment_named(client, name) for name in dict.fromkeys(experiments)] if experiments
            else client.search_experiments())  # an experiment named twice is read once
    trials: list[Trial] = []
    keys: dict[str, list[str]] = {}  # run id -> its curves' metric keys
    known: dict[str, dict[str, History]] = {}  # run id -> the histories of its one-step metrics
    for exp in exps:
        runs = trial_runs(client, exp.experiment_id, names.ROLE, TRIAL_ROLE)
        if experiments and not runs:
            raise LookupError(f"MLflow experiment {exp.name!r} at {tracking_uri} holds no sweep trials"
                              + _train_runs_note(client, [exp]))
        for run in runs:
            if names.PARENT_RUN in run.tags:
                trials.append(_trial(exp.name, run))
                keys[run.run_id] = [k for k in curve_keys(run.metrics, trials[-1].kind) if trials[-1].reads(k)]
                known[run.run_id] = one_step(run, keys[run.run_id], trials[-1].kind)
    if not trials:
        raise LookupError(f"no sweep trials found at {tracking_uri}"
                          + (f" in experiments {experiments}" if experiments else "") + _train_runs_note(client, exps))
    histories = read_histories(client, {run_id: [k for k in run_keys if k not in known[run_id]]
                                        for run_id, run_keys in keys.items() if len(run_keys) > len(known[run_id])})
    for run_id, run_known in known.items():
        histories.setdefault(run_id, {}).update(run_known)
    scores = read_scores(client, [t.run_id for t in trials if t.kind is LLM])
    for trial in trials:
        trial.curves = curves(histories.get(trial.run_id, {}), keys[trial.run_id], trial.kind)
        trial.scores, trial.start_scores = scores.get(trial.run_id, ({}, {}))
    return trials

