"""The settings of one language-model run (:class:`LLMTrainSettings`) and of its loss
(:class:`ObjectiveSettings`), checked when made.

A flat dataclass, so that a sweep spec can set and search each field by name
(:mod:`haepo_ray.sweep.kinds.llm.plan`) and the command line has one option per field
(:mod:`haepo_ray.cli.llm_options`, help texts from :data:`HELP`);
:meth:`LLMTrainSettings.objective` derives the loss's settings from it. This module imports
neither torch nor transformers: the ``haepo`` command builds its parser from it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from haepo_ray.llm.rewards import SummaryReward

__all__ = ["ALGORITHMS", "ASPECTS", "DPO_PAIRS", "DTYPES", "HELP", "LLMTrainSettings", "MEMORY_FIELDS",
           "ObjectiveSettings", "READ_WHEN", "SWITCHES", "torch_dtype", "unread"]

Algorithm = Literal["HAEPO", "GRPO", "DPO"]
ALGORITHMS: tuple[str, ...] = ("HAEPO", "GRPO", "DPO")
DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16", "float64")  # float64: exactness tests
# DPO's preference pairs: gold (the paper's: the gold summary preferred to each sample of its group)
# or reward (the best sample of a group preferred to the worst by the reward HAEPO and GRPO optimise).
DPO_PAIRS: tuple[str, ...] = ("gold", "reward")
# ACLSum's aspects a run asks for (haepo_ray.llm.data.ACLSUM_ASPECTS), or all three.
ASPECTS: tuple[str, ...] = ("all", "challenge", "approach", "outcome")
_NO_DPO_TERM = ("DPO's loss has no entropy bonus and no KL penalty (its pull towards the reference policy is "
                "dpo_beta)")  # Rafailov et al. 2023, Eq. 7
_HAEPO_WEIGHTS = "it sets HAEPO's weights"
_LORA = "it sets LoRA's adapters, and with lora_r 0 there are none (every weight trains)"
# Settings that some runs do not read: each with the settings that decide it, whether a run reads
# it, and why one that does not, does not. A run given one it does not read would log a value it
# ignores: the command line (haepo_ray.cli.llm_options) and a sweep spec
# (haepo_ray.sweep.kinds.llm.plan) refuse it (unread). tests/test_llm_settings.py checks each
# algorithm's claim against its loss.
READ_WHEN: dict[str, tuple[tuple[str, ...], Callable[[Any], bool], str]] = {
    "beta_ent": (("algo",), lambda s: s.algo != "DPO", _NO_DPO_TERM),
    "beta_kl": (("algo",), lambda s: s.algo != "DPO", _NO_DPO_TERM),
    "normalization": (("algo",), lambda s: s.algo != "DPO", "DPO's loss compares the rewards, never normalised"),
    "length_normalize": (("algo",), lambda s: s.algo == "HAEPO", _HAEPO_WEIGHTS),
    "weight_temperature": (("algo",), lambda s: s.algo == "HAEPO", _HAEPO_WEIGHTS),
    "estimator": (("algo",), lambda s: s.algo == "HAEPO", "it is HAEPO's gradient estimator"),
    "num_iterations": (("algo",), lambda s: s.algo == "GRPO", "it is GRPO's steps per batch"),
    "clip_param": (("algo", "num_iterations"), lambda s: s.algo == "GRPO" and s.num_iterations > 1,
                   "it is GRPO's clip of the ratio to the old policy, and that ratio is 1 unless num_iterations > 1"),
    "dpo_beta": (("algo",), lambda s: s.algo == "DPO", "it is DPO's implicit reward's beta"),
    "dpo_pairs": (("algo",), lambda s: s.algo == "DPO", "it is DPO's preference pairs"),
    "lora_alpha": (("lora_r",), lambda s: s.lora_r > 0, _LORA),
    "lora_target_modules": (("lora_r",), lambda s: s.lora_r > 0, _LORA),
    "logits_chunk": (("logits",), lambda s: s.logits == "chunked", "it is the chunk of logits 'chunked'"),
    "adamw": (("rounding",), lambda s: s.rounding == "nearest",
              "it is torch's AdamW's, and rounding 'stochastic' steps each parameter in chunks of its own"),
}
# The settings that change a step's memory (haepo_ray.llm.capacity.estimate: trials with the same
# values have the same estimate); the others change neither memory nor a step's FLOPs.
MEMORY_FIELDS: tuple[str, ...] = (
    "model", "algo", "dtype", "batch_prompts", "group_size", "sft_batch", "max_new_tokens", "micro_batch_size",
    "gradient_checkpointing", "lora_r", "lora_target_modules", "reference", "logits", "logits_chunk", "generation",
    "decoding", "precision", "adamw", "rounding", "num_iterations", "dpo_pairs",
)
# Implementation switches: other tools' ways of running the same step (haepo_ray.llm.policy), the
# first value this project's (the default). Each setting's values; HELP says what each does.
SWITCHES: dict[str, tuple[str, ...]] = {
    "reference": ("auto", "copy", "none"),
    "logits": ("gather", "full", "chunked"),
    "generation": ("group", "batch"),
    "decoding": ("dynamic", "static"),
    "precision": ("pure", "mixed"),
    "adamw": ("auto", "foreach", "per_parameter"),
    "rounding": ("nearest", "stochastic"),  # pure bfloat16's AdamW step: torch's, or torchao's bf16_stochastic_round
}


def torch_dtype(name: str) -> Any:
    """The torch dtype of a :data:`DTYPES` name."""
    import torch

    return getattr(torch, name)


@dataclass(frozen=True)
class ObjectiveSettings:
    """The losses' settings; betas as in the paper (1e-2), GRPO's clip and DPO's beta as usual."""

    algo: Algorithm = "HAEPO"
    beta_ent: float = 1e-2
    beta_kl: float = 1e-2
    normalization: str = "zscore"
    length_normalize: bool = False
    weight_temperature: float = 1.0
    estimator: str = "weights"
    clip_param: float = 0.2
    dpo_beta: float = 0.1
    dpo_pairs: str = "gold"

    def __post_init__(self) -> None:
        from haepo_ray.loss import ESTIMATORS, NORMALIZATIONS

        if self.algo not in ALGORITHMS:
            raise ValueError(f"algo must be one of {ALGORITHMS}, got {self.algo!r}")
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {self.normalization!r}")
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {ESTIMATORS}, got {self.estimator!r}")
        if self.estimator != "weights" and self.algo != "HAEPO":
            raise ValueError(f"estimator {self.estimator!r} is HAEPO's gradient estimator, not {self.algo}'s")
        for name in ("beta_ent", "beta_kl"):
            if not 0 <= getattr(self, name) < math.inf:
                raise ValueError(f"{name} must be a finite number >= 0, got {getattr(self, name)!r}")
        for name in ("weight_temperature", "dpo_beta"):
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(f"{name} must be a finite number > 0, got {getattr(self, name)!r}")
        if not 0 < self.clip_param < 1:
            raise ValueError(f"clip_param must be in (0, 1), got {self.clip_param!r}")
        if self.dpo_pairs not in DPO_PAIRS:
            raise ValueError(f"dpo_pairs must be one of {DPO_PAIRS}, got {self.dpo_pairs!r}")
        if self.dpo_pairs != "gold" and self.algo != "DPO":
            raise ValueError(f"dpo_pairs is DPO's setting, got dpo_pairs {self.dpo_pairs!r} for {self.algo!r}")


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
    estimator: str = ObjectiveSettings.estimator
    clip_param: float = ObjectiveSettings.clip_param
    dpo_beta: float = ObjectiveSettings.dpo_beta
    dpo_pairs: str = ObjectiveSettings.dpo_pairs
    max_new_tokens: int = 48
    min_new_tokens: int = 1
    temperature: float = 1.0
    max_source_words: int = 300
    aspect: str = "all"  # ACLSum: the one aspect every prompt asks for, or all three
    micro_batch_size: int = 1
    # Memory savers (haepo_ray.llm.policy): activation recomputation, and LoRA adapters when lora_r > 0.
    gradient_checkpointing: bool = False
    flush_denormal: bool = True  # subnormal floats to zero on CPU (haepo_ray.llm.policy.denormals)
    lora_r: int = 0
    lora_alpha: float = 16.0
    lora_target_modules: tuple[str, ...] = ("q_proj", "v_proj")  # peft's default for Llama and Qwen2
    # Implementation switches (SWITCHES, haepo_ray.llm.policy), defaults this project's own step.
    reference: str = "auto"
    logits: str = "gather"
    logits_chunk: int = 256
    generation: str = "group"
    decoding: str = "dynamic"
    precision: str = "pure"
    adamw: str = "auto"
    rounding: str = "nearest"
    num_iterations: int = 1
    eval_prompts: int = 32  # held out from SFT and RL (haepo_ray.llm.data.split_examples)
    split_seed: int = 0  # the held-out / SFT / RL split: the same for every seed, so runs compare on one set
    eval_every: int = 0
    eval_samples: int = 1  # completions per held-out prompt sampled at temperature
    kl_samples: int = 4  # completions per held-out prompt sampled from the policy for the exact KL
    eval_batch: int = 8  # held-out prompts per generation call of the evaluation
    eval_start: bool = False  # also evaluate the SFT start, before the first RL update (update 0)
    reward_weights: tuple[float, float, float] = (1 / 3, 1 / 3, 1 / 3)  # token F1, cosine, length closeness

    def __post_init__(self) -> None:
        counts = {"seed": 0, "sft_examples": 0, "rl_updates": 0, "batch_prompts": 1, "group_size": 1, "sft_batch": 1,
                  "max_new_tokens": 1, "min_new_tokens": 1, "max_source_words": 1, "micro_batch_size": 0,
                  "eval_prompts": 1, "eval_every": 0, "split_seed": 0, "lora_r": 0, "logits_chunk": 1,
                  "num_iterations": 1, "eval_samples": 1, "kl_samples": 1, "eval_batch": 1}
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
        for name in ("gradient_checkpointing", "flush_denormal", "eval_start"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.aspect not in ASPECTS:
            raise ValueError(f"aspect must be one of {ASPECTS}, got {self.aspect!r}")
        if self.aspect != "all" and self.data != "aclsum":
            raise ValueError(f"aspect is ACLSum's (data aclsum), got aspect {self.aspect!r} for data {self.data!r}")
        modules = self.lora_target_modules
        if isinstance(modules, str) or not modules or not all(isinstance(m, str) and m for m in modules):
            raise ValueError(f"lora_target_modules must be a non-empty list of module names, got {modules!r}")
        object.__setattr__(self, "lora_target_modules", tuple(modules))  # a spec's YAML list; hashable
        object.__setattr__(self, "reward_weights", tuple(self.reward_weights))
        for name in ("lr", "sft_lr", "temperature", "lora_alpha"):
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(f"{name} must be a finite number > 0, got {getattr(self, name)!r}")
        self.objective()  # checks algo, betas, normalization, clip, temperature
        SummaryReward(*self.reward_weights)
        self._check_switches()
        if self.group_size == 1 and self.rl_updates and not (self.algo == "DPO" and self.dpo_pairs == "gold"):
            # (DPO's gold pairs: the gold summary against each sample, whatever the reward)
            from haepo_ray.baseline_losses import lone_episode_reason

            lone = lone_episode_reason(self.algo, normalization=self.normalization, estimator=self.estimator)
            if lone:
                raise ValueError(f"group_size 1: {lone}, so the RL updates cannot learn from the reward's value: "
                                 "use group_size >= 2")

    def _check_switches(self) -> None:
        for name, values in SWITCHES.items():
            if getattr(self, name) not in values:
                raise ValueError(f"{name} must be one of {values}, got {getattr(self, name)!r}")
        if self.reference == "none" and (self.beta_kl != 0 or self.algo == "DPO"):
            raise ValueError(f"reference 'none' needs a loss without the reference: beta_kl 0 (got {self.beta_kl!r}) "
                             f"and not DPO (got {self.algo!r})")
        if self.num_iterations > 1 and self.algo != "GRPO":
            raise ValueError(f"num_iterations > 1 is GRPO's (its clipped ratio to the old policy), got "
                             f"{self.num_iterations!r} for {self.algo!r}")
        if self.precision == "mixed" and self.dtype not in ("bfloat16", "float16"):
            raise ValueError(f"precision 'mixed' computes in a half-precision dtype: dtype must be bfloat16 or "
                             f"float16, got {self.dtype!r}")
        if self.rounding == "stochastic" and (self.dtype, self.precision) != ("bfloat16", "pure"):
            raise ValueError(f"rounding 'stochastic' rounds the AdamW steps of bfloat16 weights: dtype must be bfloat16 "
                             f"and precision 'pure', got dtype {self.dtype!r}, precision {self.precision!r}")
        if self.rounding == "stochastic" and self.lora_r > 0:
            raise ValueError("rounding 'stochastic' rounds the AdamW steps of bfloat16 weights, and with lora_r > 0 the "
                             "trained weights are LoRA's adapters, which peft keeps in float32: leave rounding out")
        if self.dtype == "float16" and self.precision == "pure" and (self.sft_examples or self.rl_updates):
            raise ValueError("dtype float16 with precision 'pure' trains AdamW in float16, where its eps (1e-8) is 0: "
                             "a weight whose gradient is 0, or below about 5e-3, becomes NaN or inf at the first step "
                             "(0/0, x/0): use precision 'mixed' (float32 weights and AdamW, the passes in float16) or "
                             "dtype bfloat16")

    def evaluated_after(self, update: int) -> bool:
        """Whether the held-out evaluation runs after RL update ``update``: every
        ``eval_every`` updates (if > 0) and after the last."""
        return update == self.rl_updates or bool(self.eval_every and update % self.eval_every == 0)

    @property
    def weights_dtype(self) -> str:
        """The parameters' dtype: ``dtype``, or float32 (master weights) with precision ``mixed``."""
        return "float32" if self.precision == "mixed" else self.dtype

    @property
    def loss_scaling(self) -> bool:
        """Whether the loss is scaled (float16 mixed precision: :attr:`~haepo_ray.llm.policy.Policy.scaler`)."""
        return self.dtype == "float16" and self.precision == "mixed"

    def objective(self) -> ObjectiveSettings:
        names = [f.name for f in dataclasses.fields(ObjectiveSettings)]
        return ObjectiveSettings(**{n: getattr(self, n) for n in names})


def unread(runs: Sequence[LLMTrainSettings], names: Iterable[str]) -> dict[str, str]:
    """Of ``names`` (the settings given to ``runs``: one run, or each of a sweep's trials), those
    that no run reads (:data:`READ_WHEN`), each with why; empty when some run reads each."""
    return {name: READ_WHEN[name][2] for name in names
            if name in READ_WHEN and not any(READ_WHEN[name][1](run) for run in runs)}


HELP: dict[str, str] = {  # one line per field: the command line's help (haepo_ray.cli.llm_options)
    "algo": "HAEPO, GRPO or DPO",
    "model": "tiny (random 2-layer test model), smollm2 (offline), or a Hugging Face name or local path",
    "data": "aclsum (offline) or tldr:PATH_OR_ID (a .jsonl/.parquet file or a datasets id)",
    "sft_examples": "supervised examples before RL",
    "rl_updates": "RL updates",
    "batch_prompts": "prompts per update",
    "group_size": "completions per prompt, M",
    "seed": "the run's seed (sampling, initialisation)",
    "device": "cpu or cuda[:N]",
    "dtype": f"weights' dtype: {', '.join(DTYPES)}",
    "lr": "RL learning rate",
    "sft_lr": "SFT learning rate",
    "sft_batch": "examples per SFT step",
    "beta_ent": "entropy bonus (HAEPO: of the weights; GRPO: of the tokens; DPO has none)",
    "beta_kl": "KL penalty to the reference policy (HAEPO, GRPO; DPO's pull towards it is dpo_beta)",
    "normalization": "returns' normalisation: zscore, sum or none",
    "length_normalize": "HAEPO: weights from L_k / length instead of the paper's plain sum",
    "weight_temperature": "HAEPO: weights from L_k / tau",
    "estimator": "HAEPO's gradient: weights (through the weights alone, the paper's Sec. 3) or unbiased (the "
                 "appendix's Monte Carlo estimator: adds the loss times grad log p of the sampled completions)",
    "clip_param": "GRPO: the ratio's clip epsilon",
    "dpo_beta": "DPO: the implicit reward's beta",
    "dpo_pairs": "DPO: its preference pairs, gold (the paper's: the gold summary preferred to each of its group's "
                 "samples) or reward (per group, the sample with the highest reward preferred to the lowest's)",
    "max_new_tokens": "tokens per completion at most",
    "min_new_tokens": "tokens per completion at least",
    "temperature": "sampling temperature",
    "max_source_words": "cut each source text to N words",
    "aspect": "ACLSum: every prompt asks for this aspect (challenge, approach, outcome), or all three (all)",
    "micro_batch_size": "completions per backward pass (0: the whole update at once)",
    "gradient_checkpointing": "recompute each decoder layer's activations in the backward pass",
    "flush_denormal": "flush subnormal floats to zero on the CPU thread that runs the passes (HAEPO's one-hot "
                      "weights make the LM head's backward meet them, many times slower on x86 without)",
    "lora_r": "LoRA rank (0: train every weight)",
    "lora_alpha": "LoRA scale alpha",
    "lora_target_modules": "modules that get LoRA adapters",
    "reference": "reference policy: auto (LoRA: the adapter switched off, else a frozen copy), copy (a frozen "
                 "copy even with LoRA), none (no reference pass; needs beta_kl 0, not DPO)",
    "logits": "token log-probs: gather (log-softmax's normaliser and the chosen token's logit), full (the "
              "log-softmax over the vocabulary kept for the backward), chunked (the LM head on logits_chunk "
              "tokens at a time, recomputed in the backward)",
    "logits_chunk": "tokens per LM-head chunk of logits chunked",
    "generation": "sampling: group (one generate call per prompt, each from its own seed) or batch (one call "
                  "for all of a worker's prompts, from the first prompt's seed)",
    "decoding": "generate's KV cache: dynamic (grown each token) or static (preallocated for prompts padded "
                "to a multiple of 64 tokens; on CUDA transformers compiles the decode step, CUDA graphs)",
    "precision": "pure (weights, gradients and AdamW's state in dtype) or mixed (those in float32, the passes "
                 "under autocast to dtype bfloat16 or float16; float16's loss dynamically scaled)",
    "adamw": "AdamW's step: auto (torch chooses: multi-tensor on CUDA), foreach (multi-tensor) or per_parameter",
    "rounding": "pure bfloat16's AdamW step (without LoRA): nearest (torch's; a step below half a weight's "
                "bfloat16 spacing is lost) or stochastic (computed in float32, rounded up or down so that the "
                "expected weight is the float32 step's)",
    "num_iterations": "GRPO: optimiser steps per update's batch; > 1 adds the old policy's log-prob pass and "
                      "the ratio to it",
    "eval_prompts": "held-out prompts of the evaluation (eval/* metrics, generations.jsonl)",
    "split_seed": "seed of the held-out / SFT / RL split (the same for every run)",
    "eval_every": "also evaluate on the held-out prompts every N updates (0: only after the last)",
    "eval_samples": "completions per held-out prompt sampled at the training temperature",
    "kl_samples": "completions per held-out prompt sampled from the policy (temperature 1, EOS allowed) for the "
                  "exact KL to the reference (eval/policy/kl_exact)",
    "eval_batch": "held-out prompts per generation call of the evaluation (its sampled completions: one call "
                  "from the call's first prompt's seed)",
    "eval_start": "also evaluate the SFT start before the first RL update (update 0; in that update's row as "
                  "eval_start, in generations.jsonl as update 0)",
    "reward_weights": "weights of token F1, MiniLM cosine similarity and length closeness in the reward",
}
