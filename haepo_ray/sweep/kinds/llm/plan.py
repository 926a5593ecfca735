"""A language-model sweep spec (key ``llm``) resolved once: :class:`LLMPlan`.

The :class:`~haepo_ray.sweep.plan_base.Plan` of trials that fine-tune a causal LM
(:mod:`haepo_ray.llm`) on Ray Train workers (or, with ``llm.num_workers: 0``, in the trial's
own process). A trial's config (:mod:`haepo_ray.sweep.kinds.llm.config`) is the
:class:`~haepo_ray.llm.settings.LLMTrainSettings` fields plus ``ray_train`` (the workers and
checkpointing of :mod:`haepo_ray.sweep.kinds.llm.trainable`); MLflow logs both as params.

Spec names: ``settings`` and ``search_space`` take the settings' fields (``lr``, ``beta_ent``,
``beta_kl``, ``seed``, ``rl_updates``, ...), ``batch_size`` for ``batch_prompts`` and, in
``search_space``, ``algorithm`` for ``algo``; the model and data come from ``llm``, the
device from ``llm.use_gpu``. A setting is refused where trials would not read it
(:func:`~haepo_ray.sweep.kinds.llm.methods.unread_errors`: ``beta_kl`` for DPO, ``clip_param`` for HAEPO).

Methods (:mod:`haepo_ray.sweep.kinds.llm.methods`): with a method among the values of
``search_space.algorithm``, the trial config's ``method`` holds the trial's method as written
(``{algo: HAEPO, length_normalize: true}``; the search values' ``algorithm``) and ``algo`` and
each setting a method sets follow from it (Tune's ``sample_from``): MLflow logs the values each
trial ran with.

GPU memory: :meth:`LLMPlan.fitted` holds the plan to the cluster's GPUs before launch
(:mod:`haepo_ray.sweep.kinds.llm.fit`); the fitted plan's trial configs carry their estimates
(``gpu_memory``), the memory settings they run with (``fit``: with ``llm.fit: auto`` a trial
over its GPU is planned to fit) and, with ``gpus_per_worker: auto``, their share of a GPU.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from haepo_ray import names
from haepo_ray.llm.data import data_file
from haepo_ray.names import BATCH_SIZE_ALIAS
from haepo_ray.sweep.cluster import Cluster, require_resources
from haepo_ray.sweep.idle_scheduler import idle_scheduler
from haepo_ray.sweep.kinds.llm.config import METHOD, RAY_TRAIN, RENAMES, trial_settings
from haepo_ray.sweep.kinds.llm.fit import CONFIG_KEY, FIT_KEY, GPUFit, config_memory_key, estimate_keys
from haepo_ray.sweep.kinds.llm.methods import method_errors, method_of, methods, unread_errors
from haepo_ray.sweep.kinds.llm.model import model_problems
from haepo_ray.sweep.kinds.llm.spec import LLMSweepSpec
from haepo_ray.sweep.plan_base import Plan
from haepo_ray.sweep.spec import SpecError
from haepo_ray.tracking.schema import LLM_METRICS

__all__ = ["PLAN", "LLMPlan"]

_FROM_SPEC = ("algo", "model", "data", "device")  # set by algorithm, llm.model, llm.data, llm.use_gpu


def _settings_fields() -> dict[str, Any]:
    from haepo_ray.llm.settings import LLMTrainSettings

    return {f.name: f.default for f in dataclasses.fields(LLMTrainSettings)}


@dataclass(frozen=True)
class LLMPlan(Plan):
    """A checked language-model spec (``llm``); build it with :meth:`resolve`."""

    spec: LLMSweepSpec
    base_config: dict[str, Any]  # the trial config before its search values
    search_keys: dict[str, str]  # spec search-space name -> trial config key
    mutations: dict[str, Any] = dataclasses.field(default_factory=dict)  # (PBT is refused)
    fit: GPUFit | None = None  # the trials' memory estimates (fitted plans: :meth:`fitted`)

    # The update, which a trial restarted from a Ray Train checkpoint continues, where Tune's
    # training iteration starts again.
    step_key = names.LLM_UPDATE
    step_name = "updates"
    default_metrics = LLM_METRICS
    progress_metrics = {names.LLM_UPDATE: "update", names.LLM_TRAIN_TIME: "time (s)", names.LLM_REWARD: "reward"}
    tune_checkpoints = False  # the trial's loop checkpoints (haepo_ray.sweep.kinds.llm.trainable)
    patched = ("tune", "torch")  # the memory simulator's overrides fit the trials (fitted)

    @classmethod
    def resolve(cls, spec: LLMSweepSpec) -> LLMPlan:
        """Checks the setting names and values."""
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
        errors += method_errors(spec, allowed)
        if errors:
            raise SpecError("\n".join(errors))
        llm = spec.llm
        base = {**fields, "algo": spec.algorithm or "HAEPO", "model": llm.model, "data": _trial_data(llm.data),
                "device": "cpu", **_renamed(spec.settings)}
        base[RAY_TRAIN] = {
            "num_workers": llm.num_workers,
            "use_gpu": llm.use_gpu,
            "resources_per_worker": _worker_resources(spec),
            "checkpoint_frequency": spec.checkpoint_frequency,
            "keep_checkpoints": spec.keep_checkpoints,
        }
        keys = {name: RENAMES.get(name, name) for name in spec.search_space}
        if methods(spec) is not None:
            keys["algorithm"] = METHOD
        plan = cls(spec, base, keys).checked()
        errors = unread_errors(spec, lambda value, values: plan.trial_config(
            {**values, "algorithm": value} if spec.algorithm is None else values, validate=False))
        errors += _idle_scheduler(spec, plan.base_config["rl_updates"])
        if errors:
            raise SpecError("\n".join(errors))
        return plan

    @property
    def title(self) -> str:
        llm = self.spec.llm
        algorithm = self.spec.algorithm or self.spec.search_space["algorithm"].describe()
        where = f"{llm.num_workers} Ray Train worker(s)" if llm.num_workers else "in the trial's process"
        return f"{algorithm} on {llm.model} / {llm.data}, {where}" + (" with GPUs" if llm.use_gpu else "")

    @property
    def label(self) -> str:
        return f"llm_{self.spec.llm.model}"

    @property
    def subject(self) -> tuple[dict[str, Any], dict[str, str]]:
        llm = self.spec.llm
        return {"llm": llm.model_dump(mode="json")}, {names.MODEL: llm.model, names.DATA: llm.data}

    @property
    def root_files(self) -> tuple[str, ...]:
        """The greedy completions (the human-evaluation form reads them)."""
        from haepo_ray.llm.train import GENERATIONS_FILE

        return (GENERATIONS_FILE,)

    @cached_property
    def param_space(self) -> dict[str, Any]:
        """Tune's ``param_space``; with methods (module docstring), ``algo`` and each setting a
        method sets follow from the trial's ``method``."""
        space = super().param_space
        listed = methods(self.spec)
        if listed is not None:
            from ray import tune

            dim = self.spec.search_space["algorithm"]
            space[METHOD] = dim.model_copy(update={"values": listed}).to_tune()
            for key in sorted({k for m in listed for k in m}):
                default = self.base_config[key]
                space[key] = tune.sample_from(
                    lambda given, key=key, default=default: _trial_config(given)[METHOD].get(key, default))
        return space

    def base_space(self) -> dict[str, Any]:
        """The base config, and in a fitted plan each trial's estimate and GPU share."""
        space = dict(self.base_config)
        fit = self.fit
        if fit is not None:
            space[CONFIG_KEY] = (fit.config(None) if self._trial_estimates else
                                 self._per_trial(fit.config))
            space[FIT_KEY] = fit.fit_config(None) if self._trial_estimates else self._per_trial(fit.fit_config)
            if self.spec.llm.gpus_per_worker == "auto":
                per_worker = {**space[RAY_TRAIN]["resources_per_worker"], "GPU": self._per_trial(fit.fraction)}
                space[RAY_TRAIN] = {**space[RAY_TRAIN], "resources_per_worker": per_worker}
        return space

    @property
    def _trial_estimates(self) -> bool:
        """Optuna searches a setting that changes memory: each trial estimates itself."""
        from haepo_ray.llm.capacity.estimate import MEMORY_FIELDS

        return self.spec.search.algorithm == "optuna" and any(k in MEMORY_FIELDS for k in self.search_keys.values())

    def _per_trial(self, value_of_key):
        """``value_of_key(memory key)`` in a trial's config: one value, or Tune's per-trial
        ``sample_from`` when the trials' configurations differ."""
        if len(self.fit.estimates) == 1:
            return value_of_key(next(iter(self.fit.estimates)))
        from ray import tune

        return tune.sample_from(lambda given: value_of_key(config_memory_key(_trial_config(given))))

    def fitted(self, cluster: Cluster) -> LLMPlan:
        """This plan held to ``cluster``'s GPUs (:mod:`haepo_ray.sweep.kinds.llm.fit`): with
        ``llm.use_gpu`` or ``llm.gpu_memory_gb``, each distinct trial configuration is simulated
        once; with ``llm.fit: auto`` a trial over the limit is planned to fit
        (:meth:`~haepo_ray.sweep.kinds.llm.fit.GPUFit.planned`), and trials that cannot fit are
        refused (SpecError naming each); trials that ask a local Ray for more CPUs or GPUs
        than it has, or whose model cannot be found or lacks their LoRA targets
        (:mod:`~haepo_ray.sweep.kinds.llm.model`), fail."""
        spec, llm = self.spec, self.spec.llm
        file = data_file(self.base_config["data"])
        if cluster.embedded and file is not None and not file.is_file():
            raise SpecError(f"{spec.source or '<spec>'}: llm.data: {file} does not exist (from {llm.data!r}, a path "
                            "from the folder the sweep starts in)")
        require_resources(spec, self.trial_resources(), cluster, gpus_from="llm.use_gpu",
                          cpu_fix="set llm.use_gpu: false",
                          cpus_from="resources.cpus, and llm.num_workers x llm.cpus_per_worker")
        from haepo_ray.sweep.planned import PlannedTrial, planned_trials

        planned = planned_trials(self)
        estimated = llm.use_gpu or llm.gpu_memory_gb  # each trial's memory, with prompts of llm.prompt_tokens
        problems = model_problems(llm.model, (self.trial_config(t.values, validate=False)
                                              for t in planned or [PlannedTrial(0, {})]), searched=spec.search_space,
                                  prompt_tokens=llm.prompt_tokens if estimated else None)
        if problems:
            raise SpecError("\n".join(f"{spec.source or '<spec>'}: {problem}" for problem in problems))
        if not estimated:
            return self
        if llm.gpu_memory_gb:
            limit, source = llm.gpu_memory_gb, "llm.gpu_memory_gb"
        else:
            limit, source = cluster.gpu_memory_gib, f"Ray's GPUs, {cluster.gpu_kind}"
        trials = planned or ([] if self._trial_estimates else [PlannedTrial(0, {})])
        from haepo_ray.llm.capacity.accelerators import RAY_ACCELERATOR_TYPES

        accelerator = RAY_ACCELERATOR_TYPES.get(cluster.gpu_kind)  # None: the paper's
        keys = {t.index: self._key(t.values) for t in trials}
        estimates = estimate_keys(dict.fromkeys(keys.values()), prompt_tokens=llm.prompt_tokens,
                                  workers=llm.num_workers, accelerator=accelerator)
        fit = GPUFit(limit, source, llm.gpu_reserve_gb, llm.prompt_tokens, estimates, mode=llm.fit,
                     accelerator=accelerator).planned(keys.values(), workers=llm.num_workers)
        over = [f"{spec.source or '<spec>'}: trial {t.index} ({self._describe(t.values)}): {fit.refusal(keys[t.index])}"
                for t in trials if fit.refused(keys[t.index])]
        if over:
            raise SpecError("\n".join(over))
        if llm.gpus_per_worker == "auto":
            if limit is None:
                raise SpecError(f"{spec.source or '<spec>'}: llm.gpus_per_worker: auto needs the GPUs' memory: set "
                                "llm.gpu_memory_gb (Ray reports no accelerator type this sweep knows)")
            if self._trial_estimates:
                raise SpecError(f"{spec.source or '<spec>'}: llm.gpus_per_worker: auto cannot size trials that Optuna "
                                "suggests with another memory setting; give a number")
        return dataclasses.replace(self, fit=fit)

    def _describe(self, values: dict[str, Any]) -> str:
        """A trial for messages: its algorithm and search values, e.g. ``GRPO, group_size 16``."""
        values = dict(values)
        method = method_of(values.pop("algorithm", self.spec.algorithm))
        algorithm = method.pop("algo")
        return ", ".join([algorithm, *(f"{name} {value}" for name, value in {**method, **values}.items())])

    def estimate_of(self, values: dict[str, Any]):
        """The fitted plan's :class:`~haepo_ray.sweep.kinds.llm.fit.TrialEstimate` of a planned trial (of
        the settings it runs with)."""
        return self.fit.estimates[self.fit.runs(self._key(values))]

    def _key(self, values: dict[str, Any]) -> tuple:
        """The memory key of the trial with these search values."""
        return config_memory_key(self.trial_config(values, validate=False).__dict__)

    def trial_columns(self, values: dict[str, Any]) -> dict[str, Any]:
        """Columns of ``haepo sweep --dry-run``'s trials beside their values: the estimate, and
        the SFT start (its key's first 12 digits; trials with the same one share it)."""
        from haepo_ray.llm.sft_start import start_key

        columns = {}
        if self.fit is not None and not self._trial_estimates:
            est = self.estimate_of(values)
            columns = {"reserved GiB (est.)": float(f"{est.reserved_gib:.3g}"),
                       "peak GiB (est.)": float(f"{est.peak_gib:.3g}"), "in": est.phase}
            if self.spec.llm.gpus_per_worker == "auto":
                columns["GPU/worker"] = self._worker_resources(values)["GPU"]
            if self.fit.mode == "auto" and self.fit.limit_gib is not None:
                chosen = self.fit.fit_config(self._key(values))
                columns |= {"fit": "planned" if chosen["planned"] else "as given",
                            "micro_batch_size": chosen["micro_batch_size"] or "whole",
                            "checkpointing": "on" if chosen["gradient_checkpointing"] else "off",
                            "hours (est.)": float(f"{est.seconds / 3600:.3g}")}
        columns["SFT start"] = start_key(self.trial_config(values, validate=False))[:12]
        return columns

    @property
    def fit_summary(self) -> str | None:
        """What ``haepo sweep --dry-run`` says of the trials' fit to their GPUs."""
        fit, llm = self.fit, self.spec.llm
        if fit is None:
            return "GPU memory: not estimated (CPU trials; set llm.gpu_memory_gb to estimate them for a GPU)"
        limit = (f"held to {fit.limit_gib:g} GiB ({fit.limit_source}) with {fit.reserve_gib:g} GiB reserve"
                 if fit.limit_gib is not None else "no limit known: set llm.gpu_memory_gb to refuse what cannot fit")
        how = ("each trial estimates itself when it starts (Optuna suggests its memory settings)"
               if self._trial_estimates else f"{len(fit.estimates)} distinct configuration(s) simulated")
        if fit.mode == "auto" and fit.limit_gib is not None:
            how += (f"; llm.fit auto: {len(fit.plans)} configuration(s) over the limit planned to fit (the "
                    "micro_batch_size and gradient_checkpointing that fit at the lowest roofline time on "
                    f"{fit.fit_config(None)['accelerator']})")
        return (f"GPU memory: one worker's estimated reserved memory (prompts of {llm.prompt_tokens} tokens), "
                f"{limit}; {how}")

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

    def trial_resources(self, values: dict[str, Any] | None = None) -> dict[str, float]:
        """The trial's process plus its Ray Train workers."""
        per_worker = self._worker_resources(values or {})
        own = self._own_resources(per_worker)
        workers = self.spec.llm.num_workers
        total = {"CPU": own["cpu"] + workers * per_worker["CPU"],
                 "GPU": own["gpu"] + workers * per_worker.get("GPU", 0)}
        return {k: v for k, v in total.items() if v}

    def trainable(self):
        """The trial function (:func:`~haepo_ray.sweep.kinds.llm.trainable.llm_trial`) with its own
        process's resources (Ray Train workers ask Ray Train for theirs)."""
        from ray import tune

        from haepo_ray.sweep.kinds.llm.trainable import llm_trial

        if self.spec.llm.num_workers == 0 and self.spec.llm.gpus_per_worker == "auto":  # a share per trial
            return tune.with_resources(
                llm_trial, lambda config: self._own_resources(config[RAY_TRAIN]["resources_per_worker"]))
        return tune.with_resources(llm_trial, self._own_resources(self._worker_resources({})))

    def _worker_resources(self, values: dict[str, Any]) -> dict[str, float]:
        """One Ray Train worker's resources; with ``gpus_per_worker: auto``, the fitted share of
        a GPU of the trial with these search values (1 before the plan is fitted)."""
        resources = _worker_resources(self.spec)
        if resources.get("GPU") == "auto":
            resources["GPU"] = self.fit.fraction(self._key(values)) \
                if self.fit is not None and self.fit.limit_gib is not None else 1.0
        return resources

    def _own_resources(self, per_worker: dict[str, float]) -> dict[str, float]:
        """The spec's ``resources``, plus one worker's when the trial's process trains."""
        spec = self.spec
        own = {"cpu": spec.resources.cpus, "gpu": spec.resources.gpus}
        if spec.llm.num_workers == 0:
            own = {"cpu": own["cpu"] + per_worker["CPU"], "gpu": own["gpu"] + per_worker.get("GPU", 0)}
        return own

    @property
    def trial_tags(self) -> dict[str, str]:
        """MLflow tag -> trial config key, tags that differ between trials."""
        return {names.ALGORITHM: "algo", names.MODEL: "model", names.DATA: "data"}


def _renamed(values: dict[str, Any]) -> dict[str, Any]:
    """Spec names -> LLMTrainSettings fields; a method (``algorithm``) gives ``algo`` and its settings."""
    renamed = {RENAMES.get(k, k): v for k, v in values.items() if k != "algorithm"}
    return renamed | (method_of(values["algorithm"]) if "algorithm" in values else {})


def _idle_scheduler(spec: LLMSweepSpec, rl_updates: int) -> list[str]:
    """ASHA's first comparison, at ``grace_period`` updates, stops nothing at or after every
    trial's last update (the most ``rl_updates`` the trials can take; with more values than a
    few, or a continuous axis, it is not judged)."""
    ends = "search_space.rl_updates" if "rl_updates" in spec.search_space else "settings.rl_updates"
    combinations = spec.value_combinations({"rl_updates": rl_updates}) or []
    updates = [c["rl_updates"] for c in combinations]
    if not updates or not all(isinstance(u, int) for u in updates):
        return []
    idle = idle_scheduler(spec.scheduler, max(updates), ends, "a decision at a trial's last update stops nothing")
    return [f"{spec.source or '<spec>'}: {idle}"] if idle else []


def _worker_resources(spec: LLMSweepSpec) -> dict[str, float | str]:
    """One worker's resources as the spec gives them (GPU "auto" until the plan is fitted)."""
    llm = spec.llm
    resources = {"CPU": llm.cpus_per_worker}
    if llm.use_gpu:
        resources["GPU"] = llm.gpus_per_worker if llm.gpus_per_worker is not None else 1.0
    return resources


def _trial_data(data: str) -> str:
    """``llm.data`` as the trials get it: a relative ``tldr:PATH`` file made absolute, from the
    folder the sweep starts in (Tune starts each trial in its own folder)."""
    file = data_file(data)
    return f"tldr:{file.resolve()}" if file is not None and not file.is_absolute() else data


def _trial_config(given: dict) -> dict:
    """The trial config a ``sample_from`` function of the plan is given: Tune's trials resolve
    the functions with the config itself (Ray 2.60 warns of a function that needs it wrapped),
    its variant generator (:mod:`haepo_ray.sweep.planned`) with the spec ``{"config": ...}``."""
    return given["config"] if "config" in given else given


PLAN = LLMPlan
