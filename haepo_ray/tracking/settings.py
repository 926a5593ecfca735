"""What a sweep logs to MLflow, and where: the settings of
:class:`~haepo_ray.tracking.callback.MLflowSweepCallback`, plain data (no Ray), which the sweep
runner builds from the spec and Tune pickles with the callback."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from haepo_ray import names
from haepo_ray.tracking.schema import DEFAULT_METRICS


@dataclass(frozen=True)
class SweepTracking:
    """What a sweep logs to MLflow, and where.

    Args:
        tracking_uri: where to log (see :func:`haepo_ray.tracking.resolve_tracking_uri`).
        experiment_name: the MLflow experiment (created when missing).
        sweep_name: the parent run's name.
        sweep_dir: the sweep's Ray results folder; identifies the sweep on resume and receives
            ``mlflow_not_logged.jsonl`` (and, during an outage, ``mlflow_backlog.pkl``).
        resume: look for the parent and children of an earlier run of this sweep first.
        artifact_location: of the experiment when it is created (None: the store's choice).
        parent_params, parent_tags: logged on the parent.
        spec_yaml, spec_source: texts logged as the parent's ``spec.yaml`` / ``spec_source.yaml``.
        trial_tags: static tags for every child (algorithm, env, ...).
        search_keys: spec search-space name -> key in the trial config (``batch_size ->
            episodes_per_batch``); the child's ``haepo.search_values`` maps each name to the
            trial's value.
        metric, mode: what "best" means for the parent's summary.
        metrics: glob patterns of result keys to log (None or empty: :data:`DEFAULT_METRICS`).
        config_metrics: config keys logged as ``config/<key>`` metrics every iteration (the
            values Population Based Training mutates).
        log_checkpoints: upload each trial's final checkpoint.
        step_key: the result key that is the MLflow step (language-model trials: the update).
        config_tags: tag -> trial config key, tags whose value differs between trials.
        checkpoint_root_files: files of the final checkpoint also logged at the run's root
            (``generations.jsonl``, which the human-evaluation form reads).
        default_params: param -> value a child run leaves out where the trial's is the same.
    """

    tracking_uri: str
    experiment_name: str
    sweep_name: str
    sweep_dir: str | None = None
    resume: bool = False
    artifact_location: str | None = None
    parent_params: Mapping[str, Any] = field(default_factory=dict)
    parent_tags: Mapping[str, str] = field(default_factory=dict)
    spec_yaml: str | None = None
    spec_source: str | None = None
    trial_tags: Mapping[str, str] = field(default_factory=dict)
    search_keys: Mapping[str, str] = field(default_factory=dict)
    metric: str | None = None
    mode: str = "max"
    metrics: tuple[str, ...] | None = DEFAULT_METRICS
    config_metrics: tuple[str, ...] = ()
    log_checkpoints: bool = True
    step_key: str = names.TRAINING_ITERATION
    config_tags: Mapping[str, str] = field(default_factory=dict)
    checkpoint_root_files: tuple[str, ...] = ()
    default_params: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in ("max", "min"):
            raise ValueError(f"SweepTracking.mode must be 'max' or 'min', got {self.mode!r}")
        # Own copies: the settings must not change under the callback (or in its pickle).
        for name in ("parent_params", "parent_tags", "trial_tags", "search_keys", "config_tags", "default_params"):
            object.__setattr__(self, name, dict(getattr(self, name)))
        object.__setattr__(self, "metrics", tuple(self.metrics or DEFAULT_METRICS))
        object.__setattr__(self, "config_metrics", tuple(self.config_metrics))
        object.__setattr__(self, "checkpoint_root_files", tuple(self.checkpoint_root_files))
        if self.sweep_dir is not None:
            object.__setattr__(self, "sweep_dir", str(self.sweep_dir))
