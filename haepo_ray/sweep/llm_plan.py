"""A language-model sweep spec (key ``llm``) resolved once: :class:`LLMPlan`.

The counterpart of :class:`~haepo_ray.sweep.plan.SweepPlan` for trials that fine-tune a
causal LM (:mod:`haepo_ray.llm`) on Ray Train workers (or, with ``llm.num_workers: 0``, in
the trial's own process). A trial's config is the
:class:`~haepo_ray.llm.settings.LLMTrainSettings` fields plus ``ray_train`` (the workers and
checkpointing of :mod:`haepo_ray.sweep.llm_trainable`); MLflow logs both as params.

Spec names: ``settings`` and ``search_space`` take the settings' fields (``lr``, ``beta_ent``,
``beta_kl``, ``seed``, ``rl_updates``, ...), ``batch_size`` for ``batch_prompts`` and, in
``search_space``, ``algorithm`` for ``algo``; the model and data come from ``llm``, the
device from ``llm.use_gpu``.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from haepo_ray import names
from haepo_ray.sweep.spec import SpecError, SweepSpec

RAY_TRAIN = "ray_train"  # the trial config's key for the workers and checkpoints
BATCH_SIZE_ALIAS = "batch_size"
RENAMES = {BATCH_SIZE_ALIAS: "batch_prompts", "algorithm": "algo"}  # spec name -> settings field
_FROM_SPEC = ("algo", "model", "data", "device")  # set by algorithm, llm.model, llm.data, llm.use_gpu


def _settings_fields() -> dict[str, Any]:
    from haepo_ray.llm.settings import LLMTrainSettings

    return {f.name: f.default for f in dataclasses.fields(LLMTrainSettings)}


@dataclass(frozen=True)
class LLMPlan:
    """A checked language-model spec; build it with :meth:`resolve`."""

    spec: SweepSpec
    base_config: dict[str, Any]  # the trial config before its search values
    search_keys: dict[str, str]  # spec search-space name -> trial config key
    mutations: dict[str, Any] = dataclasses.field(default_factory=dict)  # (PBT is refused)

    @classmethod
    def resolve(cls, spec: SweepSpec) -> LLMPlan:
        """Checks the setting names and values; raises :class:`SpecError` naming the file,
        the key and what is allowed."""
        source = spec.source or "<spec>"
        fields = _settings_fields()
        allowed = sorted(set(fields) - set(_FROM_SPEC))
        errors = []
        for section, mapping in (("settings", spec.settings), ("search_space", spec.search_space)):
            for name in mapping:
                if name in allowed or name == BATCH_SIZE_ALIAS or (section == "search_space" and name == "algorithm"):
                    continue
                hint = {"algo": " (write algorithm)", "model": " (set llm.model)", "data": " (set llm.data)",
                        "device": " (set llm.use_gpu)"}.get(name, "")
                close = difflib.get_close_matches(name, allowed, n=3)
                hint = hint or (f" (did you mean {', '.join(close)}?)" if close else "")
                errors.append(f"{source}: {section}.{name}: not a language-model setting{hint}; allowed: "
                              f"{', '.join(allowed)}, or batch_size")
            if BATCH_SIZE_ALIAS in mapping and "batch_prompts" in mapping:
                errors.append(f"{source}: {section}: give either batch_size or batch_prompts, not both")
        for name in sorted(set(spec.settings) & set(spec.search_space)):
            errors.append(f"{source}: {name}: in both settings and search_space; keep one")
        if errors:
            raise SpecError("\n".join(errors))
        llm = spec.llm
        base = {**fields, "algo": spec.algorithm or "HAEPO", "model": llm.model, "data": llm.data,
                "device": "cpu", **_renamed(spec.settings)}
        base[RAY_TRAIN] = {
            "num_workers": llm.num_workers,
            "use_gpu": llm.use_gpu,
            "resources_per_worker": _worker_resources(spec),
            "checkpoint_frequency": spec.checkpoint_frequency,
            "keep_checkpoints": spec.keep_checkpoints,
        }
        keys = {name: RENAMES.get(name, name) for name in spec.search_space}
        return checked(cls(spec, base, keys))

    @property
    def title(self) -> str:
        llm = self.spec.llm
        algorithm = self.spec.algorithm or self.spec.search_space["algorithm"].describe()
        where = f"{llm.num_workers} Ray Train worker(s)" if llm.num_workers else "in the trial's process"
        return f"{algorithm} on {llm.model} / {llm.data}, {where}" + (" with GPUs" if llm.use_gpu else "")

    @cached_property
    def param_space(self) -> dict[str, Any]:
        space = dict(self.base_config)
        for name, dim in self.spec.search_space.items():
            space[self.search_keys[name]] = dim.to_tune()
        return space

    def trial_config(self, values: dict[str, Any], *, validate: bool = True):
        """The trial's :class:`~haepo_ray.llm.settings.LLMTrainSettings` with these search values."""
        try:
            settings = trial_settings({**self.base_config, **_renamed(values)})
        except (TypeError, ValueError) as err:
            raise SpecError(str(err)) from None
        workers = self.spec.llm.num_workers
        if validate and workers and settings.batch_prompts % workers:
            raise SpecError(f"batch_size ({settings.batch_prompts} prompts) must be a multiple of "
                            f"llm.num_workers ({workers}): each worker takes whole prompt groups")
        return settings

    def search_values(self, trial_config: dict[str, Any]) -> dict[str, Any]:
        return {name: trial_config.get(key) for name, key in self.search_keys.items()}

    def trial_resources(self, values: dict[str, Any] | None = None) -> dict[str, float]:
        """The trial's process plus its Ray Train workers."""
        per_worker = _worker_resources(self.spec)
        own = self._own_resources()
        workers = self.spec.llm.num_workers
        total = {"CPU": own["cpu"] + workers * per_worker["CPU"],
                 "GPU": own["gpu"] + workers * per_worker.get("GPU", 0)}
        return {k: v for k, v in total.items() if v}

    def trainable(self):
        """The trial function (:func:`~haepo_ray.sweep.llm_trainable.llm_trial`) with its own
        process's resources (Ray Train workers ask Ray Train for theirs)."""
        from ray import tune

        from haepo_ray.sweep.llm_trainable import llm_trial

        return tune.with_resources(llm_trial, self._own_resources())

    def _own_resources(self) -> dict[str, float]:
        """The spec's ``resources``, plus one worker's when the trial's process trains."""
        spec = self.spec
        own = {"cpu": spec.resources.cpus, "gpu": spec.resources.gpus}
        if spec.llm.num_workers == 0:
            per_worker = _worker_resources(spec)
            own = {"cpu": own["cpu"] + per_worker["CPU"], "gpu": own["gpu"] + per_worker.get("GPU", 0)}
        return own

    @property
    def trial_tags(self) -> dict[str, str]:
        """MLflow tag -> trial config key, tags that differ between trials."""
        return {names.ALGORITHM: "algo", names.MODEL: "model", names.DATA: "data"}


def checked(plan):
    """``plan``, once its fixed part (no search values) makes a valid trial; each planned trial
    is checked by ``haepo sweep --dry-run``."""
    try:
        plan.trial_config({})
    except SpecError as err:
        raise SpecError(f"{plan.spec.source or '<spec>'}: settings: {err}") from None
    return plan


def trial_settings(config: dict[str, Any], device: str = "cpu"):
    """A trial config as :class:`~haepo_ray.llm.settings.LLMTrainSettings` (without ``ray_train``)."""
    from haepo_ray.llm.settings import LLMTrainSettings

    return LLMTrainSettings(**{k: v for k, v in config.items() if k != RAY_TRAIN} | {"device": device})


def _renamed(values: dict[str, Any]) -> dict[str, Any]:
    """Spec names -> LLMTrainSettings fields."""
    return {RENAMES.get(k, k): v for k, v in values.items()}


def _worker_resources(spec: SweepSpec) -> dict[str, float]:
    llm = spec.llm
    resources = {"CPU": llm.cpus_per_worker}
    if llm.use_gpu:
        resources["GPU"] = llm.gpus_per_worker if llm.gpus_per_worker is not None else 1.0
    return resources
