"""Sweep specs: the YAML files in ``tune_configs/``, validated; the part every kind of trial shares.

A spec names what its trials train, their fixed settings, a search space, how to search it
and when to stop. Every key is checked; an unknown or malformed one is an error that names
the file, the key and what is allowed. Each kind of trial adds its own keys
(:mod:`haepo_ray.sweep.kinds`): an RL sweep ``algorithm``, ``env`` and ``env_config``
(:mod:`~haepo_ray.sweep.kinds.rl.spec`), a language-model sweep ``llm``
(:mod:`~haepo_ray.sweep.kinds.llm.spec`). The format, for an RL sweep::

    name: smoke                    # experiment name (default: the file's stem); MLflow
                                   # experiment and Ray results folder
    description: free text
    algorithm: HAEPO               # HAEPO, PPO or any algorithm registered with Ray Tune
    env: haepo/ChainMDP-v0         # a haepo env id or a gymnasium id
    env_config: {length: 5}        # kwargs of the env
    settings:                      # fixed algorithm settings (AlgorithmConfig attributes,
      num_env_runners: 0           # as `AlgorithmConfig.update_from_dict` takes them)
      model_config: {fcnet_hiddens: [16]}
      batch_size: 8                # alias: episodes_per_batch (HAEPO and other algorithms
                                   # with that setting), else train_batch_size_per_learner
    search_space:                  # each entry is exactly one of:
      seed: {grid: [0, 1, 2]}      #   grid: [v, ...]          every value (a grid axis; no repeats)
      lr: {loguniform: [1e-4, 1e-1]}   #   choice: [v, ...]    one value drawn per trial
      beta_ent: {uniform: [0, 0.1]}    #   uniform: [lo, hi]   / loguniform: [lo, hi] (lo > 0)
      reward_normalization: {choice: [zscore, sum]}  #  randint: [lo, hi]  (hi excluded)
      batch_size: {grid: [8, 16]}
    search:
      algorithm: grid              # grid (grid axes only), random (grid axes + draws), or
      num_samples: 1               # optuna (Optuna TPE, no grid axes); num_samples: the grid
      seed: 0                      # is repeated num_samples times / number of Optuna trials
                                   # (repeats of a grid with seeded trials and no PBT are
                                   # copies of one run: refused)
    scheduler:                     # FIFO (default), ASHA or Population Based Training
      type: fifo                   # asha: max_t, grace_period, reduction_factor (iterations)
                                   # pbt: perturbation_interval, mutations ({lr: {loguniform:
                                   # [..]}, beta_ent: ..., beta_kl: ...}), quantile_fraction,
                                   # resample_probability, seed, synch (false: each trial
                                   # exploits when it reaches the interval, against what the
                                   # others reported so far; true: once every trial has
                                   # reached it, the whole population at once, trials that
                                   # wait paused: every interval exploits the lower quantile
                                   # whatever the timing, at the cost of waiting). Either
                                   # must act before stop.iterations: grace_period and
                                   # perturbation_interval below it (Tune does not ask the
                                   # scheduler about a trial's last result); grace_period
                                   # also below max_t (where ASHA stops every trial)
    metric: env_runners/episode_return_mean   # any key of the result, "/"-nested
    mode: max                      # max or min
    stop:                          # any criterion that is met stops the trial (>=)
      iterations: 10               # training_iteration
      seconds: 60                  # time_total_s (wall-clock seconds of the trial)
      env_steps: 100000            # env_runners/num_env_steps_sampled_lifetime
      episode_return_mean: 0.95    # env_runners/episode_return_mean
    resources: {cpus: 1, gpus: 0}  # per trial, for its main process (which holds the learner
                                   # when num_learners == 0; remote env runners and learners
                                   # add their own, see `haepo sweep --dry-run`). gpus may be
                                   # a fraction
    max_concurrent_trials: 2       # default: as many as the resources allow
    reuse_actors: true             # run the next trial in a finished trial's process (no new
                                   # process + imports per trial; see sweep/kinds/rl/trainable.py)
    max_failures: 0                # retries of a failed trial, from its last checkpoint
    checkpoint_frequency: 0        # every N iterations (0: only at the end)
    checkpoint_at_end: true
    keep_checkpoints: null         # how many to keep per trial (null: all)
    ray: {num_cpus: null, num_gpus: null}    # the embedded local Ray only (no --address)
    storage_path: null             # Ray results root (default <cwd>/.haepo/ray_results); a
                                   # shared path or URI (s3://...) on a multi-node cluster
    tracking:
      log_checkpoints: true        # upload each trial's final checkpoint to MLflow
      metrics: [...]               # glob patterns of result keys logged every iteration
                                   # (default: DEFAULT_METRICS in haepo_ray.tracking); the
                                   # sweep's metric is logged too

Numbers may be written ``1e-3`` (YAML 1.2 style): they load as floats (:mod:`~haepo_ray.sweep.spec_yaml`).

:func:`haepo_ray.sweep.kinds.load_spec` parses a file and checks its structure against its
kind's schema (pydantic); this module imports no Ray. The kind's plan then resolves the spec
(for RL trials, :class:`~haepo_ray.sweep.kinds.rl.plan.RLPlan`, against RLlib's algorithm, env
and setting names).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from haepo_ray import names
from haepo_ray.sweep.idle_scheduler import idle_scheduler
from haepo_ray.tracking.schema import flatten

DIST_KINDS = ("grid", "choice", "uniform", "loguniform", "randint")
SEARCH_ALGORITHMS = ("grid", "random", "optuna")
# The most values a search axis may take for checks that try each (Dim.finite_values), and the most
# combinations of them (SweepSpec.value_combinations); past these a check does not judge.
FEW_VALUES, FEW_COMBINATIONS = 64, 256

# Friendly stop keys -> Tune's result keys.
STOP_KEYS = {
    "iterations": names.TRAINING_ITERATION,
    "seconds": names.TIME_TOTAL_S,
    "env_steps": names.ENV_STEPS,
    "episode_return_mean": names.EPISODE_RETURN_MEAN,
}


class SpecError(ValueError):
    """A spec that cannot be used; the message names the file, the key and what is allowed."""


# --------------------------------------------------------------------------- the models


class SpecModel(BaseModel):
    # no NaN or infinity in a number key: a stop at .nan or .inf is never reached, .inf CPUs never placed
    model_config = ConfigDict(extra="forbid", frozen=False, allow_inf_nan=False)


class Dim(SpecModel):
    """One search-space axis: ``{grid: [...]}``, ``{choice: [...]}``, ``{uniform: [lo, hi]}``,
    ``{loguniform: [lo, hi]}`` or ``{randint: [lo, hi]}``; written in YAML as a one-key map."""

    kind: Literal["grid", "choice", "uniform", "loguniform", "randint"]
    values: list[Any]

    @model_validator(mode="before")
    @classmethod
    def _from_one_key_map(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and set(data) == {"kind", "values"}:
            return data
        if not isinstance(data, Mapping) or len(data) != 1:
            raise ValueError(
                f"must be a one-key map, one of {{grid: [...]}}, {{choice: [...]}}, "
                f"{{uniform: [lo, hi]}}, {{loguniform: [lo, hi]}}, {{randint: [lo, hi]}}; "
                f"got {data!r} (fixed values go under settings)"
            )
        (kind, values), = data.items()
        if kind not in DIST_KINDS:
            raise ValueError(f"unknown kind {kind!r}; allowed: {', '.join(DIST_KINDS)}")
        return {"kind": kind, "values": values}

    @model_validator(mode="after")
    def _check_values(self) -> Dim:
        v = self.values
        if self.kind in ("grid", "choice"):
            if not v:
                raise ValueError(f"{self.kind} needs at least one value")
            repeated = [x for i, x in enumerate(v) if x in v[:i]]
            if self.kind == "grid" and repeated:
                raise ValueError(f"grid repeats {repeated[0]!r}: each value is a trial, and a value twice runs one "
                                 "trial twice")
            return self
        if len(v) != 2 or not all(_is_number(x) for x in v):
            raise ValueError(f"{self.kind} needs [low, high] (two numbers), got {v!r}")
        lo, hi = v
        if not lo < hi:
            raise ValueError(f"{self.kind} needs low < high, got {v!r}")
        if self.kind == "loguniform" and lo <= 0:
            raise ValueError(f"loguniform needs 0 < low, got {v!r}")
        if self.kind == "randint" and not all(isinstance(x, int) for x in v):
            raise ValueError(f"randint needs integers, got {v!r}")
        return self

    def to_tune(self) -> Any:
        from ray import tune

        if self.kind == "grid":
            return tune.grid_search(list(self.values))
        if self.kind == "choice":
            return tune.choice(list(self.values))
        if self.kind == "uniform":
            return tune.uniform(*self.values)
        if self.kind == "loguniform":
            return tune.loguniform(*self.values)
        return tune.randint(*self.values)

    def describe(self) -> str:
        return f"{self.kind} {self.values}"

    def finite_values(self) -> list[Any] | None:
        """The values this axis gives trials when they are few: a ``grid``'s or a ``choice``'s, a
        ``randint``'s integers up to :data:`FEW_VALUES`; None for a continuous or a wider axis."""
        if self.kind in ("grid", "choice"):
            return list(self.values)
        low, high = self.values
        return list(range(low, high)) if self.kind == "randint" and high - low <= FEW_VALUES else None


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


class SearchSettings(SpecModel):
    algorithm: Literal["grid", "random", "optuna"] = "grid"
    num_samples: int = Field(1, ge=1)
    seed: int | None = Field(None, ge=0, lt=2**32, description="NumPy's seeds (Tune's draws, Optuna's TPE)")


class FIFOScheduler(SpecModel):
    type: Literal["fifo"] = "fifo"


class ASHAScheduler(SpecModel):
    type: Literal["asha"]
    max_t: int = Field(100, ge=1, description="iterations a trial may run at most")
    grace_period: int = Field(1, ge=1)
    reduction_factor: float = Field(4.0, gt=1)

    @model_validator(mode="after")
    def _grace_within_max_t(self) -> ASHAScheduler:
        if self.grace_period >= self.max_t:  # Ray refuses >; at max_t ASHA stops every trial, comparing none
            raise ValueError(f"asha's grace_period ({self.grace_period}) must be below max_t ({self.max_t}): ASHA "
                             "first compares trials at grace_period iterations and stops every trial at max_t, so "
                             "it would stop none early")
        return self


class PBTScheduler(SpecModel):
    type: Literal["pbt"]
    perturbation_interval: int = Field(5, ge=1, description="iterations between exploits")
    mutations: dict[str, Dim]
    quantile_fraction: float = Field(0.25, gt=0, le=0.5)
    resample_probability: float = Field(0.25, ge=0, le=1)
    seed: int | None = None
    synch: bool = Field(False, description="exploit once every trial reached the interval (Tune's synchronous PBT)")

    @field_validator("mutations")
    @classmethod
    def _not_empty(cls, v: dict[str, Dim]) -> dict[str, Dim]:
        if not v:
            raise ValueError("pbt needs at least one mutation, e.g. lr: {loguniform: [1e-4, 1e-1]}")
        for key, dim in v.items():
            if dim.kind == "grid":
                raise ValueError(f"{key}: pbt mutations take choice/uniform/loguniform/randint, not grid")
        return v


Scheduler = Annotated[
    Union[FIFOScheduler, ASHAScheduler, PBTScheduler], Field(discriminator="type")
]


class StopSpec(SpecModel):
    iterations: int | None = Field(None, ge=1)
    seconds: float | None = Field(None, gt=0)
    env_steps: int | None = Field(None, ge=1)
    episode_return_mean: float | None = None

    @model_validator(mode="after")
    def _at_least_one(self) -> StopSpec:
        if all(getattr(self, k) is None for k in STOP_KEYS):
            raise ValueError(f"give at least one stop criterion: {', '.join(STOP_KEYS)}")
        return self

    def to_tune(self, step_key: str = names.TRAINING_ITERATION) -> dict[str, float]:
        """Tune's stop dict: a trial stops when any result key reaches its value
        (``iterations`` counts ``step_key``)."""
        keys = {**STOP_KEYS, "iterations": step_key}
        return {keys[k]: getattr(self, k) for k in STOP_KEYS if getattr(self, k) is not None}

    def reached(self, result: Mapping[str, Any]) -> bool:
        """Whether a (nested) training result stops the run, as Tune decides with
        :meth:`to_tune`'s dict: some key's value >= its threshold; a missing key stops nothing."""
        flat = flatten(result)
        return any(key in flat and flat[key] >= value for key, value in self.to_tune().items())


class Resources(SpecModel):
    cpus: float = Field(1.0, gt=0)
    gpus: float = Field(0.0, ge=0)


class RaySettings(SpecModel):
    num_cpus: int | None = Field(None, ge=1)
    num_gpus: int | None = Field(None, ge=0)


class TrackingSettings(SpecModel):
    log_checkpoints: bool = True
    metrics: list[str] | None = None


class SweepSpec(SpecModel):
    """What every sweep spec holds; each kind of trial's spec (:mod:`haepo_ray.sweep.kinds`)
    subclasses it with its own keys."""

    name: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    description: str = ""
    algorithm: str | None = None
    settings: dict[str, Any] = Field(default_factory=dict)
    search_space: dict[str, Dim] = Field(default_factory=dict)
    search: SearchSettings = Field(default_factory=SearchSettings)
    scheduler: Scheduler = Field(default_factory=FIFOScheduler)
    metric: str = names.EPISODE_RETURN_MEAN
    mode: Literal["max", "min"] = "max"
    stop: StopSpec | None = None
    resources: Resources = Field(default_factory=Resources)
    max_concurrent_trials: int | None = Field(None, ge=1)
    reuse_actors: bool = True
    max_failures: int = Field(0, ge=-1)
    checkpoint_frequency: int = Field(0, ge=0)
    checkpoint_at_end: bool = True
    keep_checkpoints: int | None = Field(None, ge=1)
    ray: RaySettings = Field(default_factory=RaySettings)
    storage_path: str | None = None
    tracking: TrackingSettings = Field(default_factory=TrackingSettings)

    # Not part of the YAML: where the spec came from.
    source: str | None = Field(None, exclude=True)

    @model_validator(mode="after")
    def _search_fits_space(self) -> SweepSpec:
        kinds = {k: d.kind for k, d in self.search_space.items()}
        if self.search.algorithm == "grid":
            bad = [k for k, kind in kinds.items() if kind != "grid"]
            if bad:
                raise ValueError(
                    f"search.algorithm grid takes grid axes only; {bad} are not grids: "
                    "use search.algorithm random (grid axes + random draws) or optuna"
                )
        if self.search.algorithm == "optuna":
            bad = [k for k, kind in kinds.items() if kind == "grid"]
            if bad:
                raise ValueError(
                    f"search.algorithm optuna takes no grid axes; {bad} are grids: "
                    "write them as choice"
                )
            if isinstance(self.scheduler, PBTScheduler):
                raise ValueError("scheduler pbt needs search.algorithm grid or random, not optuna")
        return self

    @model_validator(mode="after")
    def _scheduler_acts_before_stop(self) -> SweepSpec:
        """Tune asks the scheduler only about results that do not stop the trial."""
        if self.stop is not None and self.stop.iterations is not None:
            idle = idle_scheduler(self.scheduler, self.stop.iterations, "stop.iterations",
                                  "Tune does not ask the scheduler about a trial's last result")
            if idle:
                raise ValueError(idle)
        return self

    def value_combinations(self, fixed: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        """Each combination of the values the trials can give the settings in ``fixed`` (spec
        name -> a trial's value when the spec does not search it): a searched one takes its
        axis's values (:meth:`Dim.finite_values`), and one PBT mutates also its mutation's
        ``choice``. None when one takes more than a few values, or a continuous mutation."""
        mutations = self.scheduler.mutations if isinstance(self.scheduler, PBTScheduler) else {}
        options = []
        for name, value in fixed.items():
            values = self.search_space[name].finite_values() if name in self.search_space else [value]
            if name in mutations:
                mutation = mutations[name]
                more = mutation.values if mutation.kind == "choice" else None
                values = None if values is None or more is None else values + [v for v in more if v not in values]
            if values is None:
                return None
            options.append(values)
        if math.prod(map(len, options)) > FEW_COMBINATIONS:
            return None
        return [dict(zip(fixed, combination)) for combination in itertools.product(*options)]

    @property
    def experiment(self) -> str:
        return self.name or "sweep"

    def relative_paths(self) -> dict[str, str]:
        """Keys that name a file or folder of this machine by a path relative to where the sweep
        starts (``llm.data``'s ``tldr:`` file, ``llm.model``'s folder): key -> that path."""
        return {}

    def resolved_yaml(self) -> str:
        """The spec with every default filled in, as YAML (the MLflow parent artifact)."""
        data = self.model_dump(mode="json")
        data["search_space"] = {k: {d["kind"]: d["values"]} for k, d in data["search_space"].items()}
        if data["scheduler"].get("mutations"):
            data["scheduler"]["mutations"] = {
                k: {d["kind"]: d["values"]} for k, d in data["scheduler"]["mutations"].items()
            }
        return yaml.safe_dump(data, sort_keys=False)
