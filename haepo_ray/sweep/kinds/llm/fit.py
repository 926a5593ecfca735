"""Language-model trials against the memory of their GPUs, before launch: :class:`GPUFit`.

Each distinct configuration of a sweep's trials (the settings that change memory,
:data:`~haepo_ray.llm.capacity.estimate.MEMORY_FIELDS`) is simulated once
(:func:`~haepo_ray.llm.capacity.estimate.estimate`: CUDA's accounting, one Ray Train worker's
share of the prompts, prompts of ``llm.prompt_tokens``). A worker needs its estimated
*reserved* memory (the caching allocator's segments replayed over the step, the CUDA context,
cuBLAS's workspaces, NCCL's buffers and the all-reduce's buffer when it has peers:
:mod:`~haepo_ray.llm.capacity.estimate`) plus ``llm.gpu_reserve_gb``, a margin for what the
estimate does not see (other kernels' workspaces, NCCL beyond its buffers). Trials that need more than the GPU's
memory are refused with what dominates their peak and the settings that shrink it; with
``gpus_per_worker: auto`` each worker asks Ray for the fraction of a GPU it needs, so small
trials share one. Every trial's config carries its estimate (:data:`CONFIG_KEY`), which MLflow
logs as parameters next to the measured ``peak_memory_mb`` metrics.

Planned to fit (``llm.fit: auto``, the default): a trial that needs more than its GPU runs
instead with the settings of :data:`PLANNED` that fit and whose estimated run time is the
lowest (:func:`plan_fit`). They do not change the mathematics: the micro-batched backward is the
chain rule (:mod:`haepo_ray.llm.objectives`), and gradient checkpointing recomputes each decoder
layer's activations from the same inputs (the same RNG state) in the backward pass. The time is
the estimate's roofline (:func:`~haepo_ray.llm.capacity.accelerators.phase_seconds`, its FLOPs
counted as the simulation runs them: a micro-batched backward's extra forward pass and
checkpointing's recomputation included). The trial's config carries the choice
(:data:`FIT_KEY`, MLflow's ``fit/*`` params; :func:`~haepo_ray.sweep.kinds.llm.config.trial_settings`
applies it). ``llm.fit: refuse`` refuses the trial instead.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ADVICE", "CONFIG_KEY", "FIT_KEY", "FIT_MODES", "GIB", "PLANNED", "Candidate", "FitPlan", "GPUFit",
           "TrialEstimate", "check_own_fit", "config_memory_key", "estimate_keys", "micro_batch_sizes", "plan_fit"]

GIB = 2**30
CONFIG_KEY = "gpu_memory"  # a trial config's key: its estimate and the limit it was checked against
FIT_KEY = "fit"  # a trial config's key: the settings it runs with (module docstring)
FIT_MODES = ("auto", "refuse")  # llm.fit
PLANNED = ("micro_batch_size", "gradient_checkpointing")  # the settings a plan may change
# what dominates a peak -> the settings that shrink it
ADVICE = {
    "activations": "micro_batch_size, gradient_checkpointing",
    "temporaries": "micro_batch_size",
    "optimizer": "lora_r",
    "gradients": "lora_r",
    "parameters": "dtype, lora_r (no second copy for the reference)",
    "kv_cache": "group_size, max_new_tokens",
    "buffers": "the model",
}


@dataclass(frozen=True)
class TrialEstimate:
    """One worker's simulated peak (GiB), the phase of the peak and what was live then, by
    category, its estimated reserved memory (GiB: what is held to the GPU's memory) and the
    run's roofline time (s) on the accelerator."""

    peak_gib: float
    phase: str
    categories: dict[str, float]
    reserved_gib: float
    seconds: float

    @property
    def largest(self) -> str:
        return max(self.categories, key=self.categories.__getitem__)


def config_memory_key(config: Mapping[str, Any]) -> tuple:
    """The memory key of a trial config (only its memory fields are read: Tune may not have
    resolved the others yet)."""
    from haepo_ray.llm.capacity.estimate import key_settings, memory_key

    return memory_key(key_settings(config))


def estimate_keys(keys: Iterable[tuple], *, prompt_tokens: int, workers: int,
                  accelerator: str | None = None) -> dict[tuple, TrialEstimate]:
    """The estimate of each memory key (:func:`~haepo_ray.llm.capacity.estimate.memory_key`),
    its time on ``accelerator`` (a name of :data:`~haepo_ray.llm.capacity.accelerators.ACCELERATORS`;
    default the paper's)."""
    from haepo_ray.llm.capacity.accelerators import ACCELERATORS, DEFAULT_ACCELERATOR, phase_seconds, run_seconds
    from haepo_ray.llm.capacity.estimate import MEMORY_FIELDS, estimate, key_settings

    device = ACCELERATORS[accelerator or DEFAULT_ACCELERATOR]
    estimates = {}
    for key in keys:
        settings = key_settings(dict(zip(MEMORY_FIELDS, key, strict=True)))
        est = estimate(settings, prompt_tokens=prompt_tokens, workers=max(workers, 1))
        peak = est.phases[est.peak_phase]
        worker = dataclasses.replace(settings, batch_prompts=settings.batch_prompts // max(workers, 1))
        estimates[key] = TrialEstimate(est.allocated_bytes / GIB, est.peak_phase,
                                       {c: b / GIB for c, b in peak.categories.items() if b}, est.reserved_bytes / GIB,
                                       run_seconds(phase_seconds(est, worker, device), settings))
    return estimates


def micro_batch_sizes(key: tuple, workers: int) -> list[int]:
    """A plan's micro-batch sizes for a trial with memory key ``key``: the divisors of one
    worker's rows in an update (its prompts times their rows, :func:`~haepo_ray.llm.objectives.rows_per_prompt`)
    below them, ascending, then 0 (the whole update in one pass)."""
    from haepo_ray.llm.capacity.estimate import MEMORY_FIELDS, key_settings
    from haepo_ray.llm.objectives import rows_per_prompt

    settings = key_settings(dict(zip(MEMORY_FIELDS, key, strict=True)))
    rows = settings.batch_prompts // max(workers, 1) * rows_per_prompt(settings.objective(), settings.group_size)
    return [d for d in range(1, rows) if rows % d == 0] + [0]


@dataclass(frozen=True)
class Candidate:
    """One combination a plan simulated: its settings, memory key and estimate."""

    micro_batch_size: int
    gradient_checkpointing: bool
    key: tuple
    estimate: TrialEstimate


@dataclass(frozen=True)
class FitPlan:
    """The settings a trial runs with (``chosen``; None: no combination fits) and every
    combination simulated to choose them."""

    chosen: Candidate | None
    considered: tuple[Candidate, ...]

    @property
    def smallest(self) -> Candidate:
        """The simulated combination of the smallest reserved memory."""
        return min(self.considered, key=lambda c: c.estimate.reserved_gib)


def _with(key: tuple, micro_batch_size: int, gradient_checkpointing: bool) -> tuple:
    from haepo_ray.llm.capacity.estimate import MEMORY_FIELDS

    values = dict(zip(MEMORY_FIELDS, key, strict=True)) | {"micro_batch_size": micro_batch_size,
                                                            "gradient_checkpointing": gradient_checkpointing}
    return tuple(values[name] for name in MEMORY_FIELDS)


def plan_fit(key: tuple, fits, estimate_of, workers: int) -> FitPlan:
    """The fastest combination of :data:`PLANNED` whose estimate ``fits`` (a predicate on a
    memory key), among checkpointing off and on and :func:`micro_batch_sizes`; ties go to
    checkpointing off, then the larger micro-batch. ``estimate_of(key)`` simulates one.

    Pruned: a combination without checkpointing is not simulated when the one with it and the
    same micro-batch does not fit (checkpointing only drops saved activations). Every
    micro-batch size is simulated: the reserved memory is not monotone in it (the allocator's
    segments; HAEPO on Qwen2.5-1.5B in float32 with checkpointing reserves 37.4, 38.3, 38.3,
    37.5 and 38.0 GiB at micro-batches of 1, 2, 4, 8 and the whole update)."""
    considered: list[Candidate] = []
    for checkpointing in (True, False):
        for size in micro_batch_sizes(key, workers):
            if not checkpointing and not fits(_with(key, size, True)):
                continue
            candidate_key = _with(key, size, checkpointing)
            considered.append(Candidate(size, checkpointing, candidate_key, estimate_of(candidate_key)))
    fitting = [c for c in considered if fits(c.key)]
    rank = lambda c: (c.estimate.seconds, c.gradient_checkpointing, -(c.micro_batch_size or math.inf))  # noqa: E731
    return FitPlan(min(fitting, key=rank) if fitting else None, tuple(considered))


@dataclass(frozen=True)
class GPUFit:
    """The estimates of a sweep's trial configurations, the GPU memory they are held to and,
    for those over it, their plans (:func:`plan_fit`; ``llm.fit: auto``)."""

    limit_gib: float | None  # None: unknown (estimates are shown and logged, nothing refused)
    limit_source: str  # where the limit comes from, for messages
    reserve_gib: float
    prompt_tokens: int
    estimates: dict[tuple, TrialEstimate]  # the trials' keys and their plans' candidates
    mode: str = "refuse"  # llm.fit
    accelerator: str | None = None  # whose roofline times the plans (None: the paper's)
    plans: dict[tuple, FitPlan] = dataclasses.field(default_factory=dict)  # a trial's key -> its plan

    def need_gib(self, key: tuple) -> float:
        return self.estimates[key].reserved_gib + self.reserve_gib

    def fits(self, key: tuple) -> bool:
        return self.limit_gib is None or self.need_gib(key) <= self.limit_gib

    def runs(self, key: tuple) -> tuple:
        """The memory key a trial with memory key ``key`` runs with: its plan's choice, or its own."""
        plan = self.plans.get(key)
        return plan.chosen.key if plan is not None and plan.chosen is not None else key

    def refused(self, key: tuple) -> bool:
        return not self.fits(self.runs(key))

    def fraction(self, key: tuple) -> float:
        """The share of a GPU one worker needs, rounded up to a hundredth."""
        if self.limit_gib is None:
            raise ValueError("gpus_per_worker: auto needs the GPUs' memory: set llm.gpu_memory_gb, or run on "
                             "a Ray cluster whose GPUs report their accelerator type")
        return min(1.0, math.ceil(100 * self.need_gib(self.runs(key)) / self.limit_gib) / 100)

    def refusal(self, key: tuple) -> str:
        """Why a trial with this key cannot run: the estimate, the limit, what dominates; when it
        was planned, those of the smallest combination simulated."""
        plan = self.plans.get(key)
        if plan is None:
            return self._over(key, ADVICE)
        smallest = plan.smallest
        advice = {c: ", ".join(s for s in a.split(", ") if s not in PLANNED) or "a GPU with more memory"
                  for c, a in ADVICE.items()}
        return (f"no micro_batch_size or gradient_checkpointing fits ({len(plan.considered)} simulated); the "
                f"smallest, micro_batch_size {smallest.micro_batch_size}, gradient_checkpointing "
                f"{str(smallest.gradient_checkpointing).lower()}: {self._over(smallest.key, advice)}")

    def _over(self, key: tuple, advice: Mapping[str, str]) -> str:
        est = self.estimates[key]
        largest = est.largest
        return (f"estimated reserved {est.reserved_gib:.3g} GiB (allocated peak {est.peak_gib:.3g} GiB in {est.phase})"
                f" + {self.reserve_gib:g} GiB reserve > "
                f"{self.limit_gib:g} GiB ({self.limit_source}); {largest} {est.categories[largest]:.3g} GiB of it: "
                f"try {advice.get(largest, 'a smaller model')}")

    def config(self, key: tuple | None) -> dict[str, float | str | None]:
        """The trial config's :data:`CONFIG_KEY` entry (``key`` None: estimated by the trial itself):
        the estimate of the settings it runs with."""
        entry: dict[str, float | str | None] = {"limit_gib": self.limit_gib, "limit_source": self.limit_source,
                                                "reserve_gib": self.reserve_gib, "prompt_tokens": self.prompt_tokens}
        if key is not None:
            est = self.estimates[self.runs(key)]
            entry |= {"estimated_peak_gib": round(est.peak_gib, 3), "peak_phase": est.phase,
                      "estimated_reserved_gib": round(est.reserved_gib, 3)}
        return entry

    def fit_config(self, key: tuple | None) -> dict[str, Any]:
        """The trial config's :data:`FIT_KEY` entry: ``llm.fit`` and, for a trial of memory key
        ``key`` (None: estimated by the trial itself), the settings of :data:`PLANNED` it runs
        with, whether a plan chose them, their estimated run time (s) and the combinations simulated."""
        from haepo_ray.llm.capacity.accelerators import DEFAULT_ACCELERATOR

        entry: dict[str, Any] = {"mode": self.mode, "accelerator": self.accelerator or DEFAULT_ACCELERATOR}
        if key is None:
            return entry
        from haepo_ray.llm.capacity.estimate import MEMORY_FIELDS

        runs = dict(zip(MEMORY_FIELDS, self.runs(key), strict=True))
        plan = self.plans.get(key)
        return entry | {name: runs[name] for name in PLANNED} | {
            "planned": plan is not None, "estimated_seconds": round(self.estimates[self.runs(key)].seconds, 1),
            "simulated": len(plan.considered) if plan is not None else 1}

    def planned(self, keys: Iterable[tuple], *, workers: int) -> GPUFit:
        """This fit with a plan (:func:`plan_fit`) for each of ``keys`` that does not fit, in
        ``auto`` mode (in ``refuse`` mode, itself)."""
        if self.mode != "auto" or self.limit_gib is None:
            return self
        estimates, plans = dict(self.estimates), {}

        def estimate_of(key: tuple) -> TrialEstimate:
            if key not in estimates:
                estimates.update(estimate_keys([key], prompt_tokens=self.prompt_tokens, workers=workers,
                                               accelerator=self.accelerator))
            return estimates[key]

        fits = lambda key: estimates[key].reserved_gib + self.reserve_gib <= self.limit_gib  # noqa: E731
        for key in dict.fromkeys(keys):
            if not self.fits(key):
                plans[key] = plan_fit(key, fits, estimate_of, workers)
        return dataclasses.replace(self, estimates=estimates, plans=plans)


def check_own_fit(config: Mapping[str, Any], workers: int) -> dict[str, Any]:
    """A trial whose memory settings the driver could not plan (Optuna suggests them) checks
    itself, and plans itself with ``llm.fit: auto``: the config it runs with (its
    :data:`CONFIG_KEY` and :data:`FIT_KEY` entries filled in); ValueError when it cannot fit its GPU."""
    entry = config.get(CONFIG_KEY)
    if not entry or "estimated_peak_gib" in entry or entry["limit_gib"] is None:
        return dict(config)
    key = config_memory_key(config)
    own = config.get(FIT_KEY, {})
    fit = GPUFit(entry["limit_gib"], entry["limit_source"], entry["reserve_gib"], entry["prompt_tokens"],
                 estimate_keys([key], prompt_tokens=entry["prompt_tokens"], workers=workers,
                               accelerator=own.get("accelerator")),
                 mode=own.get("mode", "refuse"), accelerator=own.get("accelerator")).planned([key], workers=workers)
    if fit.refused(key):
        raise ValueError(f"this trial cannot fit its GPU: {fit.refusal(key)}")
    return {**config, CONFIG_KEY: fit.config(key), FIT_KEY: fit.fit_config(key)}
