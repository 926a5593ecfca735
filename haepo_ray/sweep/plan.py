"""A sweep spec resolved once against RLlib: :class:`SweepPlan`.

The spec (:mod:`haepo_ray.sweep.spec`) says what the user wrote; the plan says what it means
for RLlib and Tune: the algorithm class, the trial config before search values, Tune's
``param_space``, which config key each search-space name sets, PBT's mutations, the stop
rules and the trainable. The tuner, tracking and the summary all read the plan; nothing
resolves the spec a second time.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from haepo_ray import configs
from haepo_ray.registry import UnknownAlgorithm
from haepo_ray.sweep.cluster import Cluster, require_gpus
from haepo_ray.sweep.llm_plan import LLMPlan, checked
from haepo_ray.sweep.spec import PBTScheduler, SpecError, SweepSpec, load_spec, parse_spec


@dataclass(frozen=True)
class SweepPlan:
    """A checked spec with everything a sweep needs from RLlib; build it with :meth:`resolve`."""

    spec: SweepSpec
    algo_cls: type
    base_config: Any  # the AlgorithmConfig of every trial before its search values
    search_keys: dict[str, str]  # spec search-space (and PBT mutation) name -> trial config key
    mutations: dict[str, Any]  # PBT's hyperparam_mutations, by config key

    @classmethod
    def resolve(cls, spec: SweepSpec) -> SweepPlan:
        """Checks the algorithm, env and setting names against RLlib and builds the plan;
        raises :class:`SpecError` naming the file, the key and what is allowed."""
        source = spec.source or "<spec>"
        try:
            base = configs.build_config(spec.algorithm, spec.env, env_config=spec.env_config,
                                        resources=(spec.resources.cpus, spec.resources.gpus))
        except UnknownAlgorithm as err:
            raise SpecError(f"{source}: algorithm: {err}") from None
        _check_env(spec, source)
        _check_setting_names(spec, base, source)
        try:
            base = configs.apply_settings(base, spec.settings)
        except ValueError as err:
            raise SpecError(f"{source}: settings: {err}") from None
        mutations_spec = spec.scheduler.mutations if isinstance(spec.scheduler, PBTScheduler) else {}
        search_keys = {name: configs.config_key(base, name) for name in spec.search_space}
        mutations = {configs.config_key(base, name): list(dim.values) if dim.kind == "choice" else dim.to_tune()
                     for name, dim in mutations_spec.items()}
        search_keys.update({key: key for key in mutations})
        return checked(cls(spec, base.algo_class, base, search_keys, mutations))

    @property
    def title(self) -> str:
        return f"{self.spec.algorithm} on {self.spec.env} {self.spec.env_config or ''}".rstrip()

    @property
    def trial_tags(self) -> dict[str, str]:
        """MLflow tag -> trial config key, tags that differ between trials (none: one
        algorithm and env per RL sweep)."""
        return {}

    @cached_property
    def param_space(self) -> dict[str, Any]:
        """Tune's ``param_space``: the trial config dict, search axes as Tune domains."""
        space = self.base_config.to_dict()
        for name, dim in self.spec.search_space.items():
            space[self.search_keys[name]] = dim.to_tune()
        return space

    def trial_config(self, values: dict[str, Any], *, validate: bool = True):
        """The AlgorithmConfig of the trial with these search values (by spec name)."""
        config = configs.apply_settings(self.base_config.copy(copy_frozen=False), values)
        if validate:
            try:
                configs.validate(config)
            except ValueError as err:
                raise SpecError(str(err)) from None
        return config

    def search_values(self, trial_config: dict[str, Any]) -> dict[str, Any]:
        """Spec name -> value of each search (and PBT mutation) key in a trial's config."""
        return {name: trial_config.get(key) for name, key in self.search_keys.items()}

    def trial_resources(self, values: dict[str, Any] | None = None) -> dict[str, float]:
        """Total resources one trial asks Ray for (main process + env runners + learners)."""
        pgf = self.algo_cls.default_resource_request(self.trial_config(values or {}, validate=False))
        total: dict[str, float] = {}
        for bundle in pgf.bundles:
            for key, value in bundle.items():
                total[key] = total.get(key, 0) + value
        return {k: v for k, v in total.items() if v}

    def trial_columns(self, values: dict[str, Any]) -> dict[str, Any]:
        """Columns of ``haepo sweep --dry-run``'s trials beside their values (none)."""
        return {}

    @property
    def fit_summary(self) -> str | None:
        """What ``haepo sweep --dry-run`` says of the trials' fit to their GPUs (nothing)."""
        return None

    def fitted(self, cluster: Cluster) -> SweepPlan:
        """This plan, once ``cluster`` can run its trials: GPU trials on a local Ray without
        GPUs fail (SpecError)."""
        require_gpus(self.spec, self.trial_resources().get("GPU", 0.0), cluster)
        return self

    def trainable(self) -> str:
        """The Tune trainable of the sweep's trials, registered under ``<algorithm>-sweep``:
        the algorithm in a :class:`~haepo_ray.sweep.trainable.SweepTrainable` (reusable, the
        spec's metric in every result)."""
        from ray.tune.registry import register_trainable

        from haepo_ray.sweep.trainable import sweep_trainable

        name = f"{self.spec.algorithm}-sweep"
        register_trainable(name, sweep_trainable(self.spec.algorithm, self.spec.metric))
        return name


Plan = SweepPlan | LLMPlan  # what a spec resolves to: an RL or a language-model sweep


def resolve_plan(spec: SweepSpec) -> Plan:
    """The spec's plan: :meth:`LLMPlan.resolve` for a spec with ``llm``, else
    :meth:`SweepPlan.resolve`; raises :class:`SpecError`."""
    return LLMPlan.resolve(spec) if spec.llm is not None else SweepPlan.resolve(spec)


def load_plan(path: str | Path) -> Plan:
    """Reads, validates and resolves a sweep spec; raises :class:`SpecError`."""
    return resolve_plan(load_spec(path))


def _check_env(spec: SweepSpec, source: str) -> None:
    from haepo_ray.envs import check_env_id, make_env

    try:
        check_env_id(spec.env)
    except ValueError as err:
        raise SpecError(f"{source}: env: {err}") from None
    try:
        make_env(spec.env, spec.env_config).close()
    except Exception as err:
        raise SpecError(f"{source}: env_config: {spec.env} does not take {spec.env_config}: "
                        f"{type(err).__name__}: {err}") from None


def _check_setting_names(spec: SweepSpec, config, source: str) -> None:
    keys = configs.setting_keys(config)
    public = sorted(k for k in keys if not k.startswith("_"))
    alias_target = configs.batch_size_key(config)
    alias = configs.BATCH_SIZE_ALIAS
    errors = []
    mutations = spec.scheduler.mutations if isinstance(spec.scheduler, PBTScheduler) else {}
    for section, names in (("settings", spec.settings), ("search_space", spec.search_space),
                           ("scheduler.mutations", mutations)):
        for name in names:
            if name == alias:
                continue
            if name in ("env", "env_config"):
                errors.append(f"{source}: {section}.{name}: set the environment with the top-level "
                              f"keys env and env_config")
            elif name not in keys:
                close = difflib.get_close_matches(name, public, n=3)
                hint = f" (did you mean {', '.join(close)}?)" if close else ""
                errors.append(
                    f"{source}: {section}.{name}: {spec.algorithm} has no setting {name!r}{hint}; "
                    f"allowed: the attributes of {type(config).__name__} (e.g. lr, gamma, "
                    f"{alias_target}, num_env_runners, model_config), or batch_size")
    for section, mapping in (("settings", spec.settings), ("search_space", spec.search_space)):
        if alias in mapping and alias_target in mapping:
            errors.append(f"{source}: {section}: give either batch_size or {alias_target}, not both")
    for name in sorted((set(spec.settings) & set(spec.search_space)) - {alias}):
        errors.append(f"{source}: {name}: in both settings and search_space; keep one")
    if errors:
        raise SpecError("\n".join(errors))


def parse_plan(data: Any, source: str = "<spec>") -> Plan:
    """:func:`~haepo_ray.sweep.spec.parse_spec`, then :func:`resolve_plan`."""
    return resolve_plan(parse_spec(data, source))
