"""SFT warm-up, then RL updates with HAEPO, GRPO or DPO; writes what part 2 logs and evaluates.

The paper's protocol (Sec. "LLM TL;DR"): the examples are split 50/50 into a supervised half
and an RL half (after holding out evaluation prompts); ``sft_examples`` supervised examples,
then ``rl_updates`` updates of ``batch_prompts`` prompts x ``group_size`` completions, every
method starting from the same SFT checkpoint, which is also the frozen reference policy.

Output of :func:`train` in ``out_dir`` (stable: MLflow logging and the blinded
human-evaluation form read it):

- ``config.json``: the resolved :class:`LLMTrainSettings`.
- ``metrics.jsonl``: one object per SFT step, ``{"update": int, "phase": "sft", "time_s":
  float, "loss": float}``, then one per RL update::

      {"update": int, "phase": "rl", "time_s": float, "reward_mean": float, "rouge_l": float,
       "semantic_similarity": float, "profanity_rate": float, "completion_length": float,
       "effective_num_trajectories": float, "kl": float, "loss": float,
       "peak_memory_mb": {"generation": float, "reference": float,
                          "forward_backward": float, "optimizer": float}}

  over the update's sampled completions: ``completion_length`` in tokens (EOS included),
  ``kl`` = mean_k (L_k - L_k^ref), a Monte-Carlo estimate of KL(pi || pi_ref) per completion,
  ``effective_num_trajectories`` = 1 / sum_k w_k^2 of HAEPO's weights, averaged over prompts,
  ``peak_memory_mb`` per phase (:mod:`haepo_ray.llm.memory`: CUDA ``max_memory_allocated``, CPU
  the process's VmHWM), ``time_s`` the update's wall time from generation to optimiser step.
- ``generations.jsonl``: one object per completion (greedy) of each evaluation prompt after
  the last update (and every ``eval_every`` updates if > 0): ``{"update": int, "prompt_id":
  str, "source": str, "reference": str, "completion": str, "reward": float, "algorithm":
  str, "model": str, "seed": int}``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import random
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from haepo_ray.llm.data import Example, format_prompt, load_examples, split_examples
from haepo_ray.llm.memory import PeakMemory
from haepo_ray.llm.models import load_model
from haepo_ray.llm.objectives import ObjectiveSettings, backward, effective_num_trajectories, group_loss
from haepo_ray.llm.rewards import RewardFn, SummaryReward, check_rewards, summary_metrics
from haepo_ray.llm.rollout import Batch, completion_batch, concat_batches, generate, sequence_logp, token_stats

__all__ = ["DTYPES", "LLMTrainSettings", "train"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
Callback = Callable[[dict[str, Any]], None]


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
    beta_ent: float = 1e-2
    beta_kl: float = 1e-2
    normalization: str = "zscore"
    length_normalize: bool = False
    weight_temperature: float = 1.0
    clip_param: float = 0.2
    dpo_beta: float = 0.1
    max_new_tokens: int = 48
    min_new_tokens: int = 1
    temperature: float = 1.0
    max_source_words: int = 300
    micro_batch_size: int = 1
    eval_prompts: int = 8
    eval_every: int = 0
    reward_weights: tuple[float, float, float] = (1 / 3, 1 / 3, 1 / 3)

    def __post_init__(self) -> None:
        counts = {"sft_examples": 0, "rl_updates": 0, "batch_prompts": 1, "group_size": 1, "sft_batch": 1,
                  "max_new_tokens": 1, "min_new_tokens": 1, "max_source_words": 1, "micro_batch_size": 0,
                  "eval_prompts": 1, "eval_every": 0}
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


def _cycle(examples: Sequence[Example], rng: random.Random) -> Iterator[Example]:
    while True:
        order = list(examples)
        rng.shuffle(order)
        yield from order


def _chunks(n: int, size: int) -> list[slice]:
    size = size if size > 0 else n
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


class _Writer:
    def __init__(self, out_dir: Path, callback: Callback | None) -> None:
        self.metrics = (out_dir / "metrics.jsonl").open("w")
        self.generations = (out_dir / "generations.jsonl").open("w")
        self.callback = callback
        self.rows: list[dict[str, Any]] = []

    def metric(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self.metrics.write(json.dumps(row) + "\n")
        self.metrics.flush()
        if self.callback is not None:
            self.callback(row)

    def generation(self, row: dict[str, Any]) -> None:
        self.generations.write(json.dumps(row) + "\n")
        self.generations.flush()

    def close(self) -> None:
        self.metrics.close()
        self.generations.close()


def _sft(model: Any, tokenizer: Any, settings: LLMTrainSettings, examples: Sequence[Example],
         writer: _Writer) -> None:
    """Supervised warm-up: token-mean NLL of the gold summary after the prompt."""
    steps = math.ceil(settings.sft_examples / settings.sft_batch)
    if not steps:
        return
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.sft_lr)
    stream = _cycle(examples, random.Random(settings.seed))
    for step in range(1, steps + 1):
        start = time.perf_counter()
        size = min(settings.sft_batch, settings.sft_examples - (step - 1) * settings.sft_batch)
        chosen = [next(stream) for _ in range(size)]
        batch = completion_batch(tokenizer, [format_prompt(e, tokenizer, settings.max_source_words) for e in chosen],
                                 [e.reference for e in chosen]).to(settings.device)
        logp, _ = token_stats(model, batch)
        loss = -logp.sum() / batch.completion_mask.sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        writer.metric({"update": step, "phase": "sft", "time_s": time.perf_counter() - start, "loss": loss.item()})


def _rl_update(model: Any, reference: Any, tokenizer: Any, optimizer: torch.optim.Optimizer,
               settings: LLMTrainSettings, examples: Sequence[Example], reward_fn: RewardFn) -> dict[str, Any]:
    objective = settings.objective()
    peaks = PeakMemory(settings.device)
    start = time.perf_counter()
    prompts = [format_prompt(e, tokenizer, settings.max_source_words) for e in examples]
    with peaks.phase("generation"):
        samples, texts = generate(model, tokenizer, prompts, group_size=settings.group_size,
                                  max_new_tokens=settings.max_new_tokens, min_new_tokens=settings.min_new_tokens,
                                  temperature=settings.temperature)
    group_examples = [e for e in examples for _ in range(settings.group_size)]
    rewards = torch.tensor(check_rewards(reward_fn(texts, group_examples), texts), device=settings.device)
    if settings.algo == "DPO":  # per prompt: [gold, samples], gold preferred to every sample
        gold = completion_batch(tokenizer, prompts, [e.reference for e in examples]).to(settings.device)
        batch = concat_batches([gold, samples], tokenizer.pad_token_id)
        returns = torch.cat([torch.ones(len(gold), device=settings.device), torch.zeros(len(samples), device=settings.device)])
        sample_rows = slice(len(gold), None)
    else:
        batch, returns, sample_rows = samples, rewards, slice(None)
    with peaks.phase("reference"), torch.no_grad():
        ref_logp = torch.cat([token_stats(reference, batch.rows(c))[0]
                              for c in _chunks(len(batch), settings.micro_batch_size)])
    with peaks.phase("forward_backward"):
        loss, logp = backward(model, batch, group_loss(objective, batch, returns, ref_logp),
                              micro_batch_size=settings.micro_batch_size, with_entropy=settings.algo == "GRPO")
    with peaks.phase("optimizer"):
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    elapsed = time.perf_counter() - start

    sampled: Batch = batch.rows(sample_rows)
    mask = sampled.completion_mask
    kl = (sequence_logp(logp[sample_rows], mask) - sequence_logp(ref_logp[sample_rows], mask)).mean()
    return {
        "phase": "rl",
        "time_s": elapsed,
        "reward_mean": rewards.mean().item(),
        **summary_metrics(texts, [e.reference for e in group_examples]),
        "completion_length": mask.sum(1).float().mean().item(),
        "effective_num_trajectories": effective_num_trajectories(objective, sampled, logp[sample_rows]),
        "kl": kl.item(),
        "loss": loss.item(),
        "peak_memory_mb": dict(peaks.allocated),
    }


def _evaluate(model: Any, tokenizer: Any, settings: LLMTrainSettings, examples: Sequence[Example],
              reward_fn: RewardFn, update: int, writer: _Writer) -> None:
    for c in _chunks(len(examples), settings.batch_prompts):
        chosen = examples[c]
        prompts = [format_prompt(e, tokenizer, settings.max_source_words) for e in chosen]
        _, texts = generate(model, tokenizer, prompts, group_size=1, max_new_tokens=settings.max_new_tokens,
                            min_new_tokens=1, greedy=True)
        rewards = check_rewards(reward_fn(texts, chosen), texts)
        for e, text, reward in zip(chosen, texts, rewards, strict=True):
            writer.generation({"update": update, "prompt_id": e.prompt_id, "source": e.source,
                               "reference": e.reference, "completion": text, "reward": reward,
                               "algorithm": settings.algo, "model": settings.model, "seed": settings.seed})


def train(settings: LLMTrainSettings, out_dir: str | Path, *, reward_fn: RewardFn | None = None,
          callback: Callback | None = None) -> list[dict[str, Any]]:
    """Run SFT then RL as ``settings`` say, write ``out_dir`` (module docstring), return the metric rows.

    ``reward_fn`` replaces the paper's :class:`SummaryReward` (tests use a verifiable one);
    ``callback`` receives every metric row as it is written (part 2 reports them live).
    """
    if settings.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {settings.device!r}: this torch build sees no CUDA device")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(dataclasses.asdict(settings), indent=2) + "\n")
    torch.manual_seed(settings.seed)
    splits = split_examples(load_examples(settings.data), settings.eval_prompts, settings.seed)
    model, tokenizer = load_model(settings.model, texts=(f"{e.source} {e.reference}" for e in splits.sft + splits.rl),
                                  seed=settings.seed, dtype=DTYPES[settings.dtype])
    model.to(settings.device).eval()  # no dropout: the micro-batched backward re-runs the same forward
    reward_fn = reward_fn or SummaryReward(*settings.reward_weights)
    writer = _Writer(out, callback)
    try:
        _sft(model, tokenizer, settings, splits.sft, writer)
        reference = copy.deepcopy(model).requires_grad_(False)
        optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr)
        stream = _cycle(splits.rl, random.Random(settings.seed + 1))
        for update in range(1, settings.rl_updates + 1):
            chosen = [next(stream) for _ in range(settings.batch_prompts)]
            writer.metric({"update": update, **_rl_update(model, reference, tokenizer, optimizer, settings,
                                                           chosen, reward_fn)})
            if settings.eval_every and update % settings.eval_every == 0 and update < settings.rl_updates:
                _evaluate(model, tokenizer, settings, splits.eval, reward_fn, update, writer)
        _evaluate(model, tokenizer, settings, splits.eval, reward_fn, settings.rl_updates, writer)
    finally:
        writer.close()
    return writer.rows
