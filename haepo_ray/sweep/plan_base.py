"""What every kind of trial gives a sweep: the :class:`Plan` interface.

A sweep spec resolves to one plan, its kind's (:func:`haepo_ray.sweep.kinds.resolve_plan`);
Tune's setup, the runner, the dry run, tracking and the results ask the plan and branch on
nothing. The kinds: RL trials (:class:`~haepo_ray.sweep.kinds.rl.plan.RLPlan`, RLlib
algorithms) and language-model trials (:class:`~haepo_ray.sweep.kinds.llm.plan.LLMPlan`). A
new kind is one package with a subclass, listed in :data:`haepo_ray.sweep.kinds.KINDS`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import cached_property
from typing import Any, ClassVar

from haepo_ray.sweep.cluster import Cluster
from haepo_ray.sweep.spec import SpecError, SweepSpec

__all__ = ["Plan"]


class Plan(ABC):
    """A checked spec with everything a sweep needs from one kind of trial; a subclass is a
    frozen dataclass with these fields, built by :meth:`resolve`."""

    spec: SweepSpec
    base_config: Any  # the trial config before its search values
    search_keys: dict[str, str]  # spec search-space (and PBT mutation) name -> trial config key
    mutations: dict[str, Any]  # PBT's hyperparam_mutations, by config key

    step_key: ClassVar[str]  # the result key that counts a trial's steps (Tune's stop, ASHA, MLflow's step)
    step_name: ClassVar[str]  # what those steps are called, e.g. "iterations"
    default_metrics: ClassVar[tuple[str, ...]]  # what MLflow logs unless tracking.metrics says
    progress_metrics: ClassVar[dict[str, str]]  # the live trial table's result columns: key -> header
    tune_checkpoints: ClassVar[bool]  # Tune checkpoints the trials (else the trial itself does)
    root_files: ClassVar[tuple[str, ...]] = ()  # final-checkpoint files MLflow also gets at a run's root
    # The fence's modules (haepo_ray.upstream) whose patches and overrides the sweep applies:
    # checked before it starts (haepo_ray.upstream.check).
    patched: ClassVar[tuple[str, ...]] = ("tune",)

    @classmethod
    @abstractmethod
    def resolve(cls, spec: SweepSpec) -> Plan:
        """The plan of ``spec``; raises :class:`SpecError` naming the file, the key and what
        is allowed."""

    @property
    @abstractmethod
    def title(self) -> str:
        """One line saying what the trials train, for the dry run."""

    @property
    @abstractmethod
    def label(self) -> str:
        """What the trials train on, in their names (e.g. the env)."""

    @property
    @abstractmethod
    def subject(self) -> tuple[dict[str, Any], dict[str, str]]:
        """What the trials train on, for MLflow: (the parent run's params, every run's tags)."""

    @property
    def logged_metrics(self) -> tuple[str, ...]:
        """Globs of the result keys MLflow logs every step: ``tracking.metrics`` or the kind's
        defaults, and always the sweep's own metric (the one that ranks its trials)."""
        return tuple(dict.fromkeys((*(self.spec.tracking.metrics or self.default_metrics), self.spec.metric)))

    @property
    def trial_tags(self) -> dict[str, str]:
        """MLflow tag -> trial config key, for tags that differ between trials."""
        return {}

    @abstractmethod
    def base_space(self) -> dict[str, Any]:
        """The trial config as a dict, before its search values."""

    def default_params(self) -> dict[str, str]:
        """MLflow params a trial's run leaves out where its value is this one (empty: it logs
        its whole config)."""
        return {}

    @cached_property
    def param_space(self) -> dict[str, Any]:
        """Tune's ``param_space``: the trial config dict, search axes as Tune domains."""
        space = self.base_space()
        for name, dim in self.spec.search_space.items():
            space[self.search_keys[name]] = dim.to_tune()
        return space

    def search_values(self, trial_config: dict[str, Any]) -> dict[str, Any]:
        """Spec name -> value of each search (and PBT mutation) key in a trial's config."""
        return {name: trial_config.get(key) for name, key in self.search_keys.items()}

    def stop_dict(self) -> dict[str, float]:
        """Tune's stop criteria (result key -> threshold) of the spec's ``stop``."""
        return self.spec.stop.to_tune(self.step_key) if self.spec.stop else {}

    @abstractmethod
    def trial_config(self, values: dict[str, Any], *, validate: bool = True) -> Any:
        """The config of the trial with these search values (by spec name); raises SpecError."""

    @abstractmethod
    def trial_resources(self, values: dict[str, Any] | None = None) -> dict[str, float]:
        """Total resources one trial asks Ray for."""

    @abstractmethod
    def trainable(self) -> Any:
        """The Tune trainable of the trials (a registered name or a function)."""

    @abstractmethod
    def fitted(self, cluster: Cluster) -> Plan:
        """This plan once ``cluster`` can run its trials; raises SpecError when it cannot."""

    def trial_columns(self, values: dict[str, Any]) -> dict[str, Any]:
        """Columns of ``haepo sweep --dry-run``'s trials beside their values."""
        return {}

    @property
    def fit_summary(self) -> str | None:
        """What ``haepo sweep --dry-run`` says of the trials' fit to their GPUs."""
        return None

    def checked(self) -> Plan:
        """This plan, once its fixed part (no search values) makes a valid trial; each planned
        trial is checked by ``haepo sweep --dry-run``."""
        try:
            self.trial_config({})
        except SpecError as err:
            raise SpecError(f"{self.spec.source or '<spec>'}: settings: {err}") from None
        self._check_no_copies()
        return self

    def _check_no_copies(self) -> None:
        """A SpecError when ``search.num_samples`` repeats a grid (no random axis, no PBT to
        tell the repeats apart) whose trials have their seeds (a fixed one, or a grid axis of
        them): copies of one run, which a report counts once."""
        spec, n = self.spec, self.spec.search.num_samples
        axis, fixed = spec.search_space.get("seed"), self.param_space.get("seed")
        if (n == 1 or spec.scheduler.type == "pbt" or (axis is None and fixed is None)
                or any(dim.kind != "grid" for dim in spec.search_space.values())):
            return
        seeds = len(axis.values) if axis else 1
        raise SpecError(
            f"{spec.source or '<spec>'}: search.num_samples {n} runs each trial {n} times, each time with "
            f"{'its seed' if axis else f'seed {fixed}'}: copies of one run. Give the seeds more values instead "
            f"(search_space: seed: {{grid: {list(range(n * seeds))}}}), or search.num_samples 1")
