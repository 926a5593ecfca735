"""A language-model sweep's keys: ``llm`` (the model, the data, the Ray Train workers and the
GPU memory), and what such a sweep cannot take (PBT, an env, checkpoint_at_end off)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from haepo_ray import names
from haepo_ray.llm.data import data_file
from haepo_ray.sweep.spec import PBTScheduler, SpecModel, SweepSpec

__all__ = ["SPEC", "LLMSpec", "LLMSweepSpec", "claims"]


class LLMSpec(SpecModel):
    """A language-model sweep (key ``llm``): each trial fine-tunes ``model`` on ``data`` with
    Ray Train workers, or in its own process with ``num_workers: 0``
    (:mod:`haepo_ray.sweep.kinds.llm.trainable`). With ``use_gpu`` or ``gpu_memory_gb`` each trial's
    memory is estimated before launch; one over its GPU is planned to fit (``fit: auto``, the
    default: another micro-batch size or gradient checkpointing, which keep its gradients) or
    refused (``fit: refuse``)."""

    model: str = Field(min_length=1)
    data: str = Field("aclsum", min_length=1)  # aclsum | tldr:FILE (.jsonl/.parquet; relative: to the cwd) | tldr:ID
    num_workers: int = Field(1, ge=0)
    use_gpu: bool = False
    cpus_per_worker: float = Field(1.0, gt=0)
    # default 1 with use_gpu; "auto": the fraction of a GPU that the trial's simulated peak needs
    gpus_per_worker: Annotated[float, Field(gt=0, le=1)] | Literal["auto"] | None = None
    # The memory of each GPU (GiB): trials whose simulated peak (haepo_ray.llm.capacity) and the
    # reserve do not fit are refused before launch. Default: what Ray reports of its GPUs.
    gpu_memory_gb: float | None = Field(None, gt=0)
    gpu_reserve_gb: float = Field(1.0, ge=0)  # per process: CUDA context, workspaces, fragmentation
    # A trial over its GPU's memory: "auto" runs it with the micro_batch_size and
    # gradient_checkpointing (the same gradients) that fit at the lowest estimated time
    # (haepo_ray.sweep.kinds.llm.fit), "refuse" refuses it.
    fit: Literal["auto", "refuse"] = "auto"
    prompt_tokens: int = Field(512, ge=1)  # the prompts' length in the memory estimate

    @model_validator(mode="after")
    def _gpus(self) -> LLMSpec:
        if self.gpus_per_worker is not None and not self.use_gpu:
            raise ValueError("gpus_per_worker needs use_gpu: true")
        return self


class LLMSweepSpec(SweepSpec):
    """A spec of language-model trials (key ``llm``); ``algorithm`` or
    ``search_space.algorithm`` names HAEPO, GRPO or DPO."""

    llm: LLMSpec
    metric: str = names.LLM_REWARD

    @model_validator(mode="before")
    @classmethod
    def _not_rl(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and ("env" in data or "env_config" in data):
            raise ValueError("give env (an RL sweep) or llm (a language-model sweep), not both")
        return data

    @model_validator(mode="after")
    def _llm(self) -> LLMSweepSpec:
        searched = "algorithm" in self.search_space
        if (self.algorithm is None) == (not searched):
            raise ValueError("a language-model sweep takes algorithm (HAEPO, GRPO or DPO) or "
                             "search_space.algorithm (e.g. {grid: [HAEPO, GRPO, DPO]}), exactly one")
        if isinstance(self.scheduler, PBTScheduler):
            raise ValueError("scheduler pbt restores one trial from another's checkpoint, which "
                             "language-model trials do not support: use fifo or asha")
        if self.stop is not None and (self.stop.env_steps is not None or self.stop.episode_return_mean is not None):
            raise ValueError("stop: a language-model sweep stops on iterations (RL updates) or seconds")
        if not self.checkpoint_at_end:
            raise ValueError("checkpoint_at_end: a language-model trial always checkpoints at the end "
                             "(its generations are logged from that checkpoint)")
        if "max_concurrent_trials" not in self.model_fields_set and self.llm.num_workers:
            self.max_concurrent_trials = 1  # Tune does not count the Ray Train workers
        return self

    def relative_paths(self) -> dict[str, str]:
        data, model = data_file(self.llm.data), Path(self.llm.model)
        paths = {"llm.data": str(data)} if data is not None and not data.is_absolute() else {}
        return paths | ({"llm.model": self.llm.model} if not model.is_absolute() and model.is_dir() else {})


SPEC = LLMSweepSpec


def claims(data: Mapping[str, Any]) -> bool:
    """A spec with ``llm`` is a language-model sweep."""
    return "llm" in data
