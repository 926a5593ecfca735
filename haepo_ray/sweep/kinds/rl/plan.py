"""An RL sweep spec resolved once against RLlib: :class:`RLPlan`.

The spec (:mod:`haepo_ray.sweep.spec`) says what the user wrote; the plan
(:class:`~haepo_ray.sweep.plan_base.Plan`) says what it means for RLlib and Tune: the
algorithm class, the trial config before search values, which config key each search-space
name sets, PBT's mutations and the trainable. The tuner, tracking and the summary all read
the plan; nothing resolves the spec a second time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from haepo_ray import names
from haepo_ray.rl import configs
from haepo_ray.rl.evaluation import INTERVALS, evaluates
from haepo_ray.rl.registry import UnknownAlgorithm
from haepo_ray.sweep.cluster import Cluster, require_resources
from haepo_ray.sweep.kinds.rl.spec import RLSweepSpec
from haepo_ray.sweep.plan_base import Plan
from haepo_ray.sweep.spec import PBTScheduler, SpecError
from haepo_ray.tracking.schema import DEFAULT_METRICS, params_of, sanitize_key

__all__ = ["PLAN", "RLPlan"]


@dataclass(frozen=True)
class RLPlan(Plan):
    """A checked RL spec (``algorithm``, ``env``); build it with :meth:`resolve`."""

    spec: RLSweepSpec
    algo_cls: type
    base_config: Any  # the AlgorithmConfig of every trial before its search values
    search_keys: dict[str, str]  # spec search-space (and PBT mutation) name -> trial config key
    mutations: dict[str, Any]  # PBT's hyperparam_mutations, by config key

    step_key = names.TRAINING_ITERATION
    step_name = "iterations"
    default_metrics = DEFAULT_METRICS
    progress_metrics = {
        names.TRAINING_ITERATION: "iter",
        names.TIME_TOTAL_S: "time (s)",
        names.ENV_STEPS: "env steps",
        names.EPISODE_RETURN_MEAN: "return",
    }
    tune_checkpoints = True
    patched = ("tune", "rllib")  # the trainable's connectors patch; HAEPO's env runner's overrides

    @classmethod
    def resolve(cls, spec: RLSweepSpec) -> RLPlan:
        """Checks the algorithm, env and setting names against RLlib and builds the plan."""
        source = spec.source or "<spec>"
        try:
            base = configs.build_config(spec.algorithm, spec.env, env_config=spec.env_config,
                                        resources=(spec.resources.cpus, spec.resources.gpus))
        except UnknownAlgorithm as err:
            raise SpecError(f"{source}: algorithm: {err}") from None
        spaces = _env_spaces(spec, source)
        _check_metric(spec, source)
        _check_setting_names(spec, base, source)
        try:
            base = configs.apply_settings(base, spec.settings)
        except ValueError as err:
            raise SpecError(f"{source}: settings: {err}") from None
        try:
            configs.check_model(base, *spaces)
        except ValueError as err:
            raise SpecError(f"{source}: {err}") from None
        _check_evaluated(spec, base, source)
        mutations_spec = _mutations(spec)
        search_keys = {name: configs.config_key(base, name) for name in spec.search_space}
        mutations = {configs.config_key(base, name): list(dim.values) if dim.kind == "choice" else dim.to_tune()
                     for name, dim in mutations_spec.items()}
        search_keys.update({key: key for key in mutations})
        plan = cls(spec, base.algo_class, base, search_keys, mutations).checked()
        _check_read(spec, base, source)
        return plan

    @property
    def title(self) -> str:
        return f"{self.spec.algorithm} on {self.spec.env} {self.spec.env_config or ''}".rstrip()

    @property
    def label(self) -> str:
        return str(self.spec.env)

    @property
    def subject(self) -> tuple[dict[str, Any], dict[str, str]]:
        return {"env": self.spec.env, "env_config": self.spec.env_config}, {names.ENV: self.spec.env}

    def base_space(self) -> dict[str, Any]:
        return self.base_config.to_dict()

    def default_params(self) -> dict[str, str]:
        """The algorithm's default config as MLflow params, less every key the spec sets or
        searches: a trial's run logs those and what else differs from the defaults (a few dozen
        params, not the 300-odd of an RLlib config; half of an MLflow server's work per
        one-iteration trial was writing them)."""
        spec_keys = {configs.config_key(self.base_config, name) for name in self.spec.settings}
        spec_keys |= set(self.search_keys.values())
        defaults = params_of(self.algo_cls.get_default_config().to_dict())
        return {key: value for key, value in defaults.items()
                if not any(key == k or key.startswith(f"{k}/") for k in map(sanitize_key, spec_keys))}

    def trial_config(self, values: dict[str, Any], *, validate: bool = True):
        """The AlgorithmConfig of the trial with these search values (by spec name)."""
        config = configs.apply_settings(self.base_config.copy(copy_frozen=False), values)
        if validate:
            try:
                configs.validate(config)
            except ValueError as err:
                raise SpecError(str(err)) from None
        return config

    def trial_resources(self, values: dict[str, Any] | None = None) -> dict[str, float]:
        """Total resources one trial asks Ray for (main process + env runners + learners)."""
        return configs.requested_resources(self.trial_config(values or {}, validate=False))

    def fitted(self, cluster: Cluster) -> RLPlan:
        """This plan, once ``cluster`` can run its trials: trials that ask a local Ray for more
        CPUs or GPUs than it has fail (SpecError)."""
        require_resources(self.spec, self.trial_resources(), cluster,
                          gpus_from="resources.gpus or the learners' and env runners' GPUs",
                          cpu_fix="set the GPU settings to 0",
                          cpus_from="resources.cpus, the env runners' and the learners'")
        return self

    def trainable(self) -> str:
        """The Tune trainable of the sweep's trials, registered under ``<algorithm>-sweep``:
        the algorithm in a :class:`~haepo_ray.sweep.kinds.rl.trainable.SweepTrainable` (reusable, the
        spec's metric in every result)."""
        from ray.tune.registry import register_trainable

        from haepo_ray.sweep.kinds.rl.trainable import sweep_trainable

        name = f"{self.spec.algorithm}-sweep"
        register_trainable(name, sweep_trainable(self.spec.algorithm, self.spec.metric))
        return name


def _env_spaces(spec: RLSweepSpec, source: str) -> tuple[Any, Any]:
    """The observation and action spaces of the spec's env, made from its env_config."""
    from haepo_ray.envs import check_env_id, env_spaces

    try:
        check_env_id(spec.env)
    except ValueError as err:
        raise SpecError(f"{source}: env: {err}") from None
    try:
        return env_spaces(spec.env, spec.env_config)
    except ValueError as err:
        raise SpecError(f"{source}: env_config: {err}") from None


def new_stack_metric(metric: str) -> str | None:
    """The name RLlib's new API stack (haepo-ray's) gives ``metric``, a result key of its old
    stack (``episode_reward_mean``, ``sampler_results/...``, ``evaluation/...``); None for
    any other key."""
    evaluation = "evaluation/" if metric.startswith("evaluation/") else ""
    rest = metric.removeprefix("evaluation/").removeprefix("sampler_results/").removeprefix("env_runners/")
    old = re.fullmatch(r"episode_(reward|len)_(mean|min|max)", rest)
    if old is None:
        return None
    new = f"{evaluation}env_runners/episode_{'return' if old[1] == 'reward' else 'len'}_{old[2]}"
    return new if new != metric else None


def _mutations(spec: RLSweepSpec) -> dict[str, Any]:
    """PBT's mutations by spec name, or none."""
    return spec.scheduler.mutations if isinstance(spec.scheduler, PBTScheduler) else {}


def _given(spec: RLSweepSpec) -> tuple[tuple[str, dict[str, Any]], ...]:
    """Each section of the spec that gives settings, by its name in errors, with what it gives."""
    return (("settings", spec.settings), ("search_space", spec.search_space),
            ("scheduler.mutations", _mutations(spec)))


def _check_metric(spec: RLSweepSpec, source: str) -> None:
    new = new_stack_metric(spec.metric)
    if new is not None:
        raise SpecError(f"{source}: metric: {spec.metric!r} is a result key of RLlib's old API stack; its new "
                        f"stack, which haepo-ray runs, reports it as {new!r}")


def _check_evaluated(spec: RLSweepSpec, config, source: str) -> None:
    """A metric of RLlib's evaluation needs a config that evaluates: else no trial reports it."""
    searched = {*spec.search_space, *_mutations(spec)}
    if spec.metric.startswith(f"{names.EVALUATION}/") and not evaluates(config) and not searched & set(INTERVALS):
        raise SpecError(f"{source}: metric: {spec.metric!r} is reported only in iterations in which RLlib "
                        "evaluates, and the settings set no evaluation_interval, so no trial would report it: "
                        "set settings.evaluation_interval (e.g. 1), or rank by a training metric")


def _check_setting_names(spec: RLSweepSpec, config, source: str) -> None:
    keys = configs.setting_keys(config)
    alias_target = configs.batch_size_key(config)
    alias = names.BATCH_SIZE_ALIAS
    errors = []
    for section, given in _given(spec):
        for name in given:
            if name == alias:
                continue
            if name in ("env", "env_config"):
                errors.append(f"{source}: {section}.{name}: set the environment with the top-level "
                              f"keys env and env_config")
            elif name not in keys:
                errors.append(
                    f"{source}: {section}.{name}: {spec.algorithm} has no setting {name!r}"
                    f"{configs.setting_hint(config, name)}; "
                    f"allowed: the attributes of {type(config).__name__} (e.g. lr, gamma, "
                    f"{alias_target}, num_env_runners, model_config), or batch_size")
    for section, mapping in (("settings", spec.settings), ("search_space", spec.search_space)):
        if alias in mapping and alias_target in mapping:
            errors.append(f"{source}: {section}: give either batch_size or {alias_target}, not both")
    for name in sorted((set(spec.settings) & set(spec.search_space)) - {alias}):
        errors.append(f"{source}: {name}: in both settings and search_space; keep one")
    if errors:
        raise SpecError("\n".join(errors))


def _check_read(spec: RLSweepSpec, config, source: str) -> None:
    """A setting the spec gives that no trial would read (:func:`~haepo_ray.rl.unread.unread`: each
    would log a value that changed nothing, and a search over it would repeat one trial), judged on
    ``config`` (the trials' config before search values) with each combination of the values the
    trials give what decides it (:meth:`~haepo_ray.sweep.spec.SweepSpec.value_combinations`; not
    judged when those are many)."""
    from haepo_ray.rl.unread import READ_WHEN, unread

    errors = []
    for section, given in _given(spec):
        for name in [name for name in given if name in READ_WHEN and hasattr(config, name)]:
            combinations = spec.value_combinations({d: getattr(config, d) for d in READ_WHEN[name][0]})
            if combinations is None:
                continue  # what decides it takes many values
            runs = [configs.apply_settings(config.copy(copy_frozen=False), values) for values in combinations]
            errors += [f"{source}: {section}.{name}: {spec.algorithm} trials would ignore it: {why}; remove {name}"
                       for why in unread(runs, [name]).values()]
    if errors:
        raise SpecError("\n".join(errors))


PLAN = RLPlan
