"""SFT warm-up, then RL updates with HAEPO, GRPO or DPO; writes what part 2 logs and evaluates.

The paper's protocol (Sec. "LLM TL;DR"): the examples are split 50/50 into a supervised half
and an RL half (after holding out evaluation prompts; the split depends on ``split_seed``, not
on the run's ``seed``, so every seed and algorithm is evaluated on the same prompts); ``sft_examples`` supervised examples,
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
                          "forward_backward": float, "optimizer": float},
       "peak_memory_reserved_mb": {"generation": float, "reference": float,
                                   "forward_backward": float, "optimizer": float},
       "train_time_s": float,
       "phase_time_s": {"load": float, "sft": float, "rollout": float, "update": float,
                        "metrics": float, "eval": float}}

  over the update's sampled completions: ``completion_length`` in tokens (EOS included),
  ``kl`` = mean_k (L_k - L_k^ref), a Monte-Carlo estimate of KL(pi || pi_ref) per completion,
  ``effective_num_trajectories`` = 1 / sum_k w_k^2 of HAEPO's weights, averaged over prompts,
  ``peak_memory_mb`` per phase (:mod:`haepo_ray.llm.memory`: CUDA ``max_memory_allocated``, CPU
  the process's VmHWM) and ``peak_memory_reserved_mb`` (CUDA ``max_memory_reserved``, what the
  device must hold with the caching allocator's slack; CPU the same VmHWM), ``time_s`` the
  update's wall time from generation to optimiser step, ``train_time_s`` the run's wall time
  so far (the paper's end-to-end training time: from the :class:`LLMRun`'s start, loading
  included, to this update's evaluation, if any; a run restored from a checkpoint adds its
  own to the checkpoint's) and ``phase_time_s`` its cumulative seconds per phase: ``load``
  (data, model, reward encoder; a checkpoint's restore; a shared SFT start's wait and read),
  ``sft`` (a run that loads a shared SFT start, :mod:`haepo_ray.llm.sft_start`, counts the SFT
  seconds of the run that made it, here and in ``train_time_s``, so trials compare), ``rollout`` (sampling and
  rewards), ``update`` (reference pass, forward/backward, optimiser step), ``metrics`` (the
  row's metrics) and ``eval`` (the held-out generations). What ``train_time_s`` holds beyond
  their sum is the writing of rows and checkpoints.
- With float16 mixed precision every row (SFT and RL) also has ``"float16_overflows": int``: how
  often its gradients were inf or NaN, each time computed again at half the loss scale (no step
  is lost: :attr:`~haepo_ray.llm.policy.Policy.overflows`).
- The held-out evaluation (:mod:`haepo_ray.llm.evaluate`), after the last update and every
  ``eval_every`` updates if > 0: that update's row gains ``"eval": {"greedy": {...},
  "sampled": {...}, "policy": {...}}``, which MLflow logs as ``eval/<mode>/<metric>``. With
  ``eval_start`` the SFT start is evaluated too, before the first update: the first update's
  row gains ``"eval_start": {...}`` (the same modes, logged as ``eval_start/<mode>/<metric>``),
  its records go to generations.jsonl as update 0.
- ``generations.jsonl``: one object per held-out prompt of each evaluation, its greedy
  completion's: ``{"update": int, "prompt_id": str, "source": str, "reference": str,
  "instruction": str, "shown_source": str, "completion": str, "reward": float, "token_f1":
  float, "semantic_similarity": float, "length_closeness": float, "rouge_l": float, "rouge_2":
  float, "completion_length": int, "kl_exact": float, "algorithm": str, "model": str, "seed": int}``
  (``shown_source``: the source as the model saw it; ``kl_exact``: the prompt's exact KL to the
  reference on the policy's own samples, :mod:`haepo_ray.llm.evaluate`).

Sampling is seeded per prompt, (seed, update, the prompt's position in the update)
(:func:`~haepo_ray.llm.distributed.sample_seed`): a run is reproducible, on one worker or
several (:class:`~haepo_ray.llm.distributed.World`; each worker takes whole prompt groups),
and a run restored from a checkpoint (:meth:`LLMRun.save`) continues exactly. The price: one
``generate`` call per prompt (``group_size`` rows each) instead of one per update; with
``generation`` batch, one call per worker and update from its first prompt's seed (then the
completions depend on how the prompts split over the workers).
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from haepo_ray import names
from haepo_ray.llm.data import Example, cycle, drawn, format_prompt, jsonl_rows, load_examples, split_examples
from haepo_ray.llm.distributed import World, sample_seed
from haepo_ray.llm.evaluate import evaluate
from haepo_ray.llm.memory import PeakMemory
from haepo_ray.llm.models import load_model
from haepo_ray.llm.objectives import effective_num_trajectories, objective_of, rows_per_prompt, training_batch
from haepo_ray.llm.policy import Policy, denormals
from haepo_ray.llm.rewards import RewardFn, SummaryReward, check_rewards, summary_metrics
from haepo_ray.llm.rollout import Batch, completion_batch, overrun_problem, sample_groups, sequence_kl
from haepo_ray.llm.run_log import GENERATIONS_FILE, METRICS_FILE, Callback, RunClock, RunWriter
from haepo_ray.llm.settings import LLMTrainSettings, torch_dtype
from haepo_ray.llm.sft_start import evaluation_fields

__all__ = ["LLMRun", "LLMTrainSettings", "train"]

CONFIG_FILE = "config.json"
STATE_FILE = "state.pt"
START_EVAL_FILE = "start_eval.json"  # an SFT start's own evaluation (save_sft), with the settings it was made under

class LLMRun:
    """One run of :func:`train` on this worker of a :class:`~haepo_ray.llm.distributed.World`:
    SFT (:meth:`sft`), then RL updates one at a time (:meth:`rl`), with checkpoints of the whole
    state (:meth:`save`, :meth:`restore`). Rank 0 writes ``out_dir``."""

    def __init__(self, settings: LLMTrainSettings, out_dir: str | Path, *, world: World = World(),
                 reward_fn: RewardFn | None = None, callback: Callback | None = None) -> None:
        self.clock = RunClock()
        with self.clock.phase("load"):
            if settings.device.startswith("cuda") and not torch.cuda.is_available():
                raise ValueError(f"device {settings.device!r}: this torch build sees no CUDA device")
            if settings.batch_prompts % world.size:
                raise ValueError(f"batch_prompts ({settings.batch_prompts}) must be a multiple of the number of "
                                 f"workers ({world.size}): each worker takes whole prompt groups")
            self.settings, self.world = settings, world
            # data, a model that cannot be read and LoRA targets it lacks are refused before out_dir is made
            self.splits = split_examples(load_examples(settings.data, settings.aspect), settings.eval_prompts,
                                         settings.split_seed)
            torch.manual_seed(settings.seed)
            model, self.tokenizer = load_model(
                settings.model, texts=(f"{e.source} {e.reference}" for e in self.splits.sft + self.splits.rl),
                seed=settings.seed, dtype=torch_dtype(settings.weights_dtype))
            model.to(settings.device).eval()  # no dropout: the micro-batched backward re-runs the same forward
            self.policy = Policy(model, settings, world)  # it refuses LoRA targets the model lacks
            if problem := self._overrun_problem(model.config):
                raise ValueError(problem)
            self.out = Path(out_dir)
            if world.is_main:
                self.out.mkdir(parents=True, exist_ok=True)
                (self.out / CONFIG_FILE).write_text(json.dumps(dataclasses.asdict(settings), indent=2) + "\n")
            self.reward_fn = reward_fn or SummaryReward(*settings.reward_weights)
            summary_metrics(["warm up"], ["warm up"])  # loads the encoder and scorers outside the timed updates
            self.callback = callback
            self.writer = RunWriter(self.out if world.is_main else None, callback)
            self.update = 0  # RL updates done
            self.start_eval: dict[str, Any] | None = None  # the SFT start's evaluation (eval_start), rank 0

    def _overrun_problem(self, config: Any) -> str | None:
        """Why a prompt this run samples after, or an SFT or DPO gold row it trains on, would overrun
        the model's context (:func:`~haepo_ray.llm.rollout.overrun_problem`): said before SFT."""
        s = self.settings
        prompt = lambda e: format_prompt(e, self.tokenizer, s.max_source_words)  # noqa: E731
        rl = drawn(*self._stream("rl"), s.rl_updates * s.batch_prompts)
        given = drawn(*self._stream("sft"), s.sft_examples) + (rl if objective_of(s.objective()).with_gold else [])
        return overrun_problem(self.tokenizer, config, prompts={prompt(e) for e in rl + list(self.splits.eval)},
                               max_new_tokens=s.max_new_tokens, decoding=s.decoding,
                               given={(prompt(e), e.reference) for e in given})

    def _stream(self, phase: str) -> tuple[Sequence[Example], int]:
        """The examples ``phase`` ("sft" or "rl") draws and the seed of their order (:func:`~haepo_ray.llm.data.cycle`):
        the run's seed for SFT, seed + 1 for RL."""
        return {"sft": (self.splits.sft, self.settings.seed), "rl": (self.splits.rl, self.settings.seed + 1)}[phase]

    @property
    def model(self) -> Any:
        """The trained model (with its LoRA adapter, if any)."""
        return self.policy.model

    # ------------------------------------------------------------------ SFT

    def sft(self) -> None:
        """Supervised warm-up: token-mean NLL of the gold summary after the prompt; then the
        model is frozen as the reference policy and the RL optimiser is made."""
        s, world = self.settings, self.world
        with self.clock.phase("sft"), denormals(s):
            steps = math.ceil(s.sft_examples / s.sft_batch)
            self.policy.start_sft()
            stream = cycle(*self._stream("sft"))
            for step in range(1, steps + 1):
                start = time.perf_counter()
                size = min(s.sft_batch, s.sft_examples - (step - 1) * s.sft_batch)
                mine = [e for _, e in world.shard([next(stream) for _ in range(size)])]
                batch = completion_batch(
                    self.tokenizer, [format_prompt(e, self.tokenizer, s.max_source_words) for e in mine],
                    [e.reference for e in mine]).to(s.device) if mine else None
                tokens, = world.sum([batch.completion_mask.sum().item() if batch else 0], s.device)
                overflows = self.policy.overflows
                local_loss = self.policy.sft_step(batch, tokens).item()
                loss_value, = world.sum([local_loss], s.device)
                elapsed, = world.max([time.perf_counter() - start], s.device)
                self.writer.metric({"update": step, "phase": "sft", "time_s": elapsed, "loss": loss_value,
                                    **self._overflows_since(overflows)})
            self.policy.start_rl()
        self.evaluate_start()

    def evaluate_start(self) -> None:
        """With ``eval_start``, the held-out evaluation of the SFT start (rank 0; before any RL
        update): ``start_eval`` = ``{"fields": ..., "eval": means, "records": greedy records}``."""
        s = self.settings
        if not (s.eval_start and self.world.is_main and self.start_eval is None and self.update == 0):
            return
        with self.clock.phase("eval"), denormals(s):
            means, records = evaluate(s, self.policy, self.tokenizer, self.reward_fn, self.splits.eval)
        self.start_eval = {"fields": evaluation_fields(s), names.LLM_EVAL: means, "records": records}

    def save_sft(self, folder: str | Path) -> None:
        """This run's SFT start in a new ``folder`` (rank 0, after :meth:`sft`): ``state.pt``
        (the RL-ready model's weights, with LoRA its fresh RL adapter too, and the SFT seconds)
        and ``metrics.jsonl`` (the SFT rows); with ``eval_start`` also ``start_eval.json`` (its
        evaluation, :meth:`evaluate_start`)."""
        folder = Path(folder)
        folder.mkdir(parents=True)
        torch.save({"model": self.policy.model.state_dict(), "sft_time_s": self.clock.phases["sft"]},
                   folder / STATE_FILE)
        (folder / METRICS_FILE).write_text("".join(json.dumps(row) + "\n" for row in self.rows))
        if self.start_eval is not None:
            (folder / START_EVAL_FILE).write_text(json.dumps(self.start_eval) + "\n")

    def load_sft(self, folder: str | Path) -> None:
        """Begin RL from :meth:`save_sft`'s ``folder`` instead of :meth:`sft` (every worker): its
        weights as policy and reference, its SFT rows written as this run's, its SFT seconds
        credited to this run's clock; its evaluation (``start_eval.json``) taken as this run's
        :meth:`evaluate_start` where it was made under this run's
        :func:`~haepo_ray.llm.sft_start.evaluation_fields` (else this run evaluates the start)."""
        folder = Path(folder)
        with self.clock.phase("load"):
            state = torch.load(folder / STATE_FILE, map_location=self.settings.device, weights_only=True)
            self.policy.start_rl()
            self.policy.load_start(state["model"])
            metrics = folder / METRICS_FILE
            rows = [row for _, row in jsonl_rows(metrics.read_text().splitlines(), lambda n: f"{metrics}:{n}")]
            self.start_eval = self._shared_start_eval(folder / START_EVAL_FILE)
        for row in rows:
            self.writer.metric(row)
        self.clock.credit("sft", state["sft_time_s"])
        self.evaluate_start()

    def _shared_start_eval(self, path: Path) -> dict[str, Any] | None:
        """A start's evaluation at ``path`` as this run's (its records relabelled with this run's
        algorithm), if this run evaluates the start and it was made under the same evaluation fields."""
        if not (self.settings.eval_start and self.world.is_main and path.is_file()):
            return None
        shared = json.loads(path.read_text())
        if shared["fields"] != evaluation_fields(self.settings):
            return None
        shared["records"] = [{**record, "algorithm": self.settings.algo} for record in shared["records"]]
        return shared

    # ------------------------------------------------------------------ RL

    def rl(self) -> Iterator[dict[str, Any]]:
        """The remaining RL updates, each yielded as its metric row once done and evaluated
        (:meth:`~haepo_ray.llm.settings.LLMTrainSettings.evaluated_after`); with ``eval_start``
        the first update's row also holds the SFT start's evaluation (``eval_start``), whose
        greedy completions are written as update 0."""
        s = self.settings
        start: dict[str, Any] = {}
        if self.update == 0 and s.eval_start and self.world.is_main:
            self.evaluate_start()  # a run that began RL without sft() or load_sft()
            for record in self.start_eval["records"]:
                self.writer.generation({"update": 0, **record})
            start = {names.LLM_EVAL_START: self.start_eval[names.LLM_EVAL]}
        stream = cycle(*self._stream("rl"))
        for _ in range(self.update * s.batch_prompts):  # the prompts of the updates already done
            next(stream)
        while self.update < s.rl_updates:
            chosen = [next(stream) for _ in range(s.batch_prompts)]
            self.update += 1
            overflows = self.policy.overflows
            with denormals(self.settings):
                row = {"update": self.update, **self._rl_update(chosen), **self._overflows_since(overflows), **start}
                start = {}
                if s.evaluated_after(self.update):
                    with self.clock.phase("eval"):
                        row.update(self._evaluate())
            row.update(self.clock.times())
            self.writer.metric(row)
            yield row

    def _rl_update(self, examples: Sequence[Example]) -> dict[str, Any]:
        s, world, tokenizer, clock = self.settings, self.world, self.tokenizer, self.clock
        objective = s.objective()
        peaks = PeakMemory(s.device)
        start = time.perf_counter()
        with clock.phase("rollout"):
            mine = world.shard(examples)
            positions = [i for i, _ in mine]
            local = [e for _, e in mine]
            share = len(local) / len(examples)
            prompts = [format_prompt(e, tokenizer, s.max_source_words) for e in local]
            with peaks.phase("generation"), self.policy.autocast():
                samples, texts = sample_groups(
                    self.model, tokenizer, prompts, [sample_seed(s.seed, self.update, i) for i in positions],
                    positions, group_size=s.group_size, max_new_tokens=s.max_new_tokens,
                    min_new_tokens=s.min_new_tokens, temperature=s.temperature, together=s.generation == "batch",
                    decoding=s.decoding)
            group_examples = [e for e in local for _ in range(s.group_size)]
            rewards = torch.tensor(check_rewards(self.reward_fn(texts, group_examples), texts), device=s.device)
            golds = [e.reference for e in local] if objective_of(objective).with_gold else None  # DPO's gold pairs
            gold = completion_batch(tokenizer, prompts, golds).to(s.device) if golds else None
            batch, returns, sample_rows = training_batch(objective, samples, rewards, gold, tokenizer.pad_token_id)
        with clock.phase("update"):
            group_rows = rows_per_prompt(objective, s.group_size)
            loss, logp, ref_logp = self.policy.rl_update(batch, returns, group_rows=group_rows, share=share,
                                                         phase=peaks.phase)
        elapsed = time.perf_counter() - start

        with clock.phase("metrics"):
            sampled: Batch = batch.rows(sample_rows)
            mask = sampled.completion_mask
            ref_logp = logp if ref_logp is None else ref_logp  # reference none: the policy's own (KL 0)
            kl = sequence_kl(logp[sample_rows], ref_logp[sample_rows], mask).mean()
            means = {  # over this worker's completions (or prompts); the share weighs them into the update's
                "reward_mean": rewards.mean().item(),
                **summary_metrics(texts, [e.reference for e in group_examples]),
                "completion_length": mask.sum(1).float().mean().item(),
                "effective_num_trajectories": effective_num_trajectories(objective, sampled, logp[sample_rows],
                                                                         group_rows=s.group_size),
                "kl": kl.item(),
            }
            totals = world.sum([share * v for v in means.values()] + [loss.item()], s.device)
            elapsed, *peak = world.max([elapsed, *peaks.allocated.values(), *peaks.reserved.values()], s.device)
        n = len(peaks.allocated)
        return {
            "phase": "rl",
            "time_s": elapsed,
            **dict(zip(means, totals[:-1], strict=True)),
            "loss": totals[-1],
            "peak_memory_mb": dict(zip(peaks.allocated, peak[:n], strict=True)),
            "peak_memory_reserved_mb": dict(zip(peaks.reserved, peak[n:], strict=True)),
        }

    def _overflows_since(self, overflows: int) -> dict[str, int]:
        """A row's ``float16_overflows`` (the policy's since ``overflows``) where the loss is scaled."""
        return {names.LLM_FLOAT16_OVERFLOWS: self.policy.overflows - overflows} if self.policy.loss_scaling else {}

    def _evaluate(self) -> dict[str, Any]:
        """The held-out evaluation on rank 0 (:mod:`haepo_ray.llm.evaluate`): ``{"eval":
        {"greedy": means, "sampled": means, "policy": means}}``, the records written to
        generations.jsonl; ``{}`` elsewhere."""
        if not self.world.is_main:
            return {}
        means, records = evaluate(self.settings, self.policy, self.tokenizer, self.reward_fn, self.splits.eval)
        for record in records:
            self.writer.generation({"update": self.update, **record})
        return {names.LLM_EVAL: means}

    # ------------------------------------------------------------------ checkpoints

    def save(self, folder: str | Path, *, final: bool = False) -> None:
        """The run so far in ``folder`` (rank 0): ``state.pt`` (update, policy; unless
        ``final``, also the reference and the optimiser) and the output files. Sampling needs
        no RNG state: its seeds are (seed, update, position)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        policy = self.policy.state_dict()
        state = {"update": self.update, **({"model": policy["model"]} if final else policy)}
        torch.save(state, folder / STATE_FILE)
        for name in (METRICS_FILE, GENERATIONS_FILE, CONFIG_FILE):
            shutil.copyfile(self.out / name, folder / name)

    def restore(self, folder: str | Path) -> None:
        """Continue from :meth:`save`'s ``folder`` (every worker): the next :meth:`rl` update
        follows the saved one; the output files are the saved ones, and the times go on from
        those of its last row."""
        folder = Path(folder)
        with self.clock.phase("load"):
            state = torch.load(folder / STATE_FILE, map_location=self.settings.device, weights_only=True)
            self.policy.start_rl()  # the saved policy's structure (with LoRA: the RL adapter)
            self.policy.load_state_dict(state)
            if "optimizer" not in state and state["update"] != self.settings.rl_updates:
                raise ValueError(f"{folder}: a final checkpoint (no optimiser) at update {state['update']}, "
                                 f"but the run has {self.settings.rl_updates} updates")
            self.update = state["update"]
            if self.world.is_main:
                self.writer.close()
                for name in (METRICS_FILE, GENERATIONS_FILE):
                    shutil.copyfile(folder / name, self.out / name)
                self.writer = RunWriter(self.out, self.callback, append=True)
            metrics = folder / METRICS_FILE
            lines = metrics.read_text().splitlines()
            self.writer.rows = [row for _, row in jsonl_rows(lines, lambda n: f"{metrics}:{n}")]
        self.clock.resume(self.writer.rows[-1])

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.writer.rows

    def close(self) -> None:
        self.writer.close()


def train(settings: LLMTrainSettings, out_dir: str | Path, *, reward_fn: RewardFn | None = None,
          callback: Callback | None = None) -> list[dict[str, Any]]:
    """Run SFT then RL as ``settings`` say, write ``out_dir`` (module docstring), return the metric rows.

    ``reward_fn`` replaces the paper's :class:`SummaryReward` (tests use a verifiable one);
    ``callback`` receives every metric row as it is written. On several workers (Ray Train),
    :mod:`haepo_ray.sweep.kinds.llm.trainable` drives an :class:`LLMRun` instead.
    """
    run = LLMRun(settings, out_dir, reward_fn=reward_fn, callback=callback)
    try:
        run.sft()
        for _ in run.rl():
            pass
    finally:
        run.close()
    return run.rows
