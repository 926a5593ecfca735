"""The settings of one language-model run (:class:`LLMTrainSettings`), checked when made.

A flat dataclass, so that a sweep spec can set and search each field by name
(:mod:`haepo_ray.sweep.llm_plan`); :meth:`LLMTrainSettings.objective` derives the loss's
:class:`~haepo_ray.llm.objectives.ObjectiveSettings` from it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

import torch

from haepo_ray.llm.objectives import ObjectiveSettings
from haepo_ray.llm.rewards import SummaryReward

__all__ = ["DTYPES", "LLMTrainSettings"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}  # float64: exactness tests


@dataclass(frozen=True)
class LLMTrainSettings:
    """Everything a run depends on; defaults are the paper's where it gives them."""

    algo: str = "HAEPO"
    model: str = "smollm2"
    data: str = "aclsum"
    sft_examples: int = 1000
    rl_updates: int = 1000
    batch_prompts: int = 4
    group_size: int = 4
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    lr: float = 5e-5
    sft_lr: float = 5e-5
    sft_batch: int = 4
    # The loss's settings, flat so that a spec can search them; their defaults are the loss's.
    beta_ent: float = ObjectiveSettings.beta_ent
    beta_kl: float = ObjectiveSettings.beta_kl
    normalization: str = ObjectiveSettings.normalization
    length_normalize: bool = ObjectiveSettings.length_normalize
    weight_temperature: float = ObjectiveSettings.weight_temperature
    clip_param: float = ObjectiveSettings.clip_param
    dpo_beta: float = ObjectiveSettings.dpo_beta
    max_new_tokens: int = 48
    min_new_tokens: int = 1
    temperature: float = 1.0
    max_source_words: int = 300
    micro_batch_size: int = 1
    eval_prompts: int = 8
    split_seed: int = 0  # the held-out / SFT / RL split: the same for every seed, so runs compare on one set
    eval_every: int = 0
    reward_weights: tuple[float, float, float] = (1 / 3, 1 / 3, 1 / 3)

    def __post_init__(self) -> None:
        counts = {"sft_examples": 0, "rl_updates": 0, "batch_prompts": 1, "group_size": 1, "sft_batch": 1,
                  "max_new_tokens": 1, "min_new_tokens": 1, "max_source_words": 1, "micro_batch_size": 0,
                  "eval_prompts": 1, "eval_every": 0, "split_seed": 0}
        for name, low in counts.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(f"min_new_tokens ({self.min_new_tokens}) exceeds max_new_tokens ({self.max_new_tokens})")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"device must be cpu or cuda[:N], got {self.device!r}")
        for name in ("lr", "sft_lr", "temperature"):
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(f"{name} must be a finite number > 0, got {getattr(self, name)!r}")
        self.objective()  # checks algo, betas, normalization, clip, temperature
        SummaryReward(*self.reward_weights)

    def objective(self) -> ObjectiveSettings:
        names = [f.name for f in dataclasses.fields(ObjectiveSettings)]
        return ObjectiveSettings(**{n: getattr(self, n) for n in names})
