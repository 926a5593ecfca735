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
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ADVICE", "CONFIG_KEY", "GIB", "GPUFit", "TrialEstimate", "check_own_fit", "config_memory_key",
           "estimate_keys"]

GIB = 2**30
CONFIG_KEY = "gpu_memory"  # a trial config's key: its estimate and the limit it was checked against
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
    category, and its estimated reserved memory (GiB: what is held to the GPU's memory)."""

    peak_gib: float
    phase: str
    categories: dict[str, float]
    reserved_gib: float

    @property
    def largest(self) -> str:
        return max(self.categories, key=self.categories.__getitem__)


def config_memory_key(config: Mapping[str, Any]) -> tuple:
    """The memory key of a trial config (only its memory fields are read: Tune may not have
    resolved the others yet)."""
    from haepo_ray.llm.capacity.estimate import MEMORY_FIELDS, memory_key
    from haepo_ray.llm.settings import LLMTrainSettings

    return memory_key(LLMTrainSettings(**{name: config[name] for name in MEMORY_FIELDS}))


def estimate_keys(keys: Iterable[tuple], *, prompt_tokens: int, workers: int) -> dict[tuple, TrialEstimate]:
    """The estimate of each memory key (:func:`~haepo_ray.llm.capacity.estimate.memory_key`)."""
    from haepo_ray.llm.capacity.estimate import MEMORY_FIELDS, estimate
    from haepo_ray.llm.settings import LLMTrainSettings

    estimates = {}
    for key in keys:
        est = estimate(LLMTrainSettings(**dict(zip(MEMORY_FIELDS, key, strict=True))), prompt_tokens=prompt_tokens,
                       workers=max(workers, 1))
        peak = est.phases[est.peak_phase]
        estimates[key] = TrialEstimate(est.allocated_bytes / GIB, est.peak_phase,
                                       {c: b / GIB for c, b in peak.categories.items() if b}, est.reserved_bytes / GIB)
    return estimates


@dataclass(frozen=True)
class GPUFit:
    """The estimates of a sweep's trial configurations and the GPU memory they are held to."""

    limit_gib: float | None  # None: unknown (estimates are shown and logged, nothing refused)
    limit_source: str  # where the limit comes from, for messages
    reserve_gib: float
    prompt_tokens: int
    estimates: dict[tuple, TrialEstimate]

    def need_gib(self, key: tuple) -> float:
        return self.estimates[key].reserved_gib + self.reserve_gib

    def fits(self, key: tuple) -> bool:
        return self.limit_gib is None or self.need_gib(key) <= self.limit_gib

    def fraction(self, key: tuple) -> float:
        """The share of a GPU one worker needs, rounded up to a hundredth."""
        if self.limit_gib is None:
            raise ValueError("gpus_per_worker: auto needs the GPUs' memory: set llm.gpu_memory_gb, or run on "
                             "a Ray cluster whose GPUs report their accelerator type")
        return min(1.0, math.ceil(100 * self.need_gib(key) / self.limit_gib) / 100)

    def refusal(self, key: tuple) -> str:
        """Why a trial with this key cannot run: the estimate, the limit, what dominates."""
        est = self.estimates[key]
        largest = est.largest
        return (f"estimated reserved {est.reserved_gib:.3g} GiB (allocated peak {est.peak_gib:.3g} GiB in {est.phase})"
                f" + {self.reserve_gib:g} GiB reserve > "
                f"{self.limit_gib:g} GiB ({self.limit_source}); {largest} {est.categories[largest]:.3g} GiB of it: "
                f"try {ADVICE.get(largest, 'a smaller model')}")

    def config(self, key: tuple | None) -> dict[str, float | str | None]:
        """The trial config's :data:`CONFIG_KEY` entry (``key`` None: estimated by the trial itself)."""
        entry: dict[str, float | str | None] = {"limit_gib": self.limit_gib, "limit_source": self.limit_source,
                                                "reserve_gib": self.reserve_gib, "prompt_tokens": self.prompt_tokens}
        if key is not None:
            est = self.estimates[key]
            entry |= {"estimated_peak_gib": round(est.peak_gib, 3), "peak_phase": est.phase,
                      "estimated_reserved_gib": round(est.reserved_gib, 3)}
        return entry


def check_own_fit(config: Mapping[str, Any], workers: int) -> None:
    """A trial whose memory settings the driver could not plan (Optuna suggests them) checks
    itself: ValueError when it cannot fit its GPU."""
    entry = config.get(CONFIG_KEY)
    if not entry or "estimated_peak_gib" in entry or entry["limit_gib"] is None:
        return
    key = config_memory_key(config)
    fit = GPUFit(entry["limit_gib"], entry["limit_source"], entry["reserve_gib"], entry["prompt_tokens"],
                 estimate_keys([key], prompt_tokens=entry["prompt_tokens"], workers=workers))
    if not fit.fits(key):
        raise ValueError(f"this trial cannot fit its GPU: {fit.refusal(key)}")
