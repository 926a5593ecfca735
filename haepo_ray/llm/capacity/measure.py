"""The real step on this machine's CPU, measured without the simulator: each phase's peak of live bytes.

:func:`measure` builds the model from its config with real (random) weights and runs the
same script as the simulator (:func:`~haepo_ray.llm.capacity.steps.run_steps`), sampling with
the trial's own :func:`~haepo_ray.llm.rollout.sample_completions` (transformers' ``generate``;
the settings must have ``min_new_tokens = max_new_tokens``, so that every completion runs to
its end, as the simulator assumes), all under PyTorch's profiler with ``profile_memory=True``. The profiler reports
every allocation and free of PyTorch's CPU allocator with its time and size, from before the
model exists; their running sum is the live bytes at every moment, and each phase's window
(a ``record_function`` range) gives its peak and the bytes live when it began. Unlike the
simulator it sees what kernels allocate inside an op, and nothing of its accounting.

The profiler's raw event list (``prof.profiler.kineto_results``) is a private attribute: the
public ``events()`` folds allocations into the ops that made them and loses their order.

:func:`measure_cuda` runs the same script on a CUDA device (where there is one) and reads each
phase's peak from ``torch.cuda.max_memory_allocated``: the comparison for ``target="cuda"``.
:func:`run_cuda` also gives each phase's wall time and the caching allocator's peak reserved
bytes (``torch.cuda.max_memory_reserved``), and :func:`time_step` the phases' wall times on
the CPU (``bench/gpu_check.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from haepo_ray.llm.capacity.steps import Shapes, generation_rows, group_sampling, run_steps
from haepo_ray.llm.rollout import padded_prompt_width, sample_completions
from haepo_ray.llm.settings import LLMTrainSettings, torch_dtype

__all__ = ["MeasuredPhase", "PhaseMarks", "RealStep", "measure", "measure_cuda", "phase_peaks", "run_cuda", "time_step"]

_PREFIX = "haepo.phase."


@dataclass(frozen=True)
class MeasuredPhase:
    """A phase's peak of live bytes and the live bytes when it began."""

    peak_bytes: int
    start_bytes: int


class PhaseMarks:
    """The :class:`~haepo_ray.llm.capacity.steps.Recorder` of a profiled run: phases as ranges."""

    def phase(self, name: str) -> contextlib.AbstractContextManager[None]:
        return record_function(_PREFIX + name)

    def category(self, name: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def track_module(self, module: Any) -> None:
        pass


def _generate(model: Any, settings: LLMTrainSettings, prompt_tokens: int) -> None:
    """One ``generate`` call of a trial on prompts of ``prompt_tokens``, left-padded as its
    ``decoding`` pads them."""
    rows, width = generation_rows(settings), padded_prompt_width(prompt_tokens, settings.decoding)
    mask = torch.ones(rows, width, dtype=torch.long)
    mask[:, :width - prompt_tokens] = 0
    sample_completions(model, torch.zeros(rows, width, dtype=torch.long), mask, **group_sampling(model, settings))


def phase_peaks(events: list[Any]) -> dict[str, MeasuredPhase]:
    """Each :class:`PhaseMarks` phase's peak from a profiled run's events."""
    cpu = torch.autograd.DeviceType.CPU
    memory = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]" and e.device_type() == cpu)
    times = [t for t, _ in memory]
    live = list(itertools.accumulate(n for _, n in memory))
    peaks: dict[str, MeasuredPhase] = {}
    for e in events:
        if not e.name().startswith(_PREFIX):
            continue
        name = e.name()[len(_PREFIX):]
        first = next(i for i, t in enumerate(times) if t >= e.start_ns())
        last = next((i for i, t in enumerate(times) if t > e.end_ns()), len(times))
        start = live[first - 1] if first else 0
        phase = MeasuredPhase(max([start, *live[first:last]]), start)
        if name not in peaks or phase.peak_bytes > peaks[name].peak_bytes:
            peaks[name] = phase
    return peaks


def measure(settings: LLMTrainSettings, config: Any, shapes: Shapes) -> dict[str, MeasuredPhase]:
    """Each phase's measured peak of a trial with ``settings`` on a random model of ``config``,
    on the CPU (module docstring)."""
    from transformers import AutoModelForCausalLM

    if settings.min_new_tokens != settings.max_new_tokens:
        raise ValueError(f"the measured step needs completions of a known length: min_new_tokens "
                         f"({settings.min_new_tokens}) must equal max_new_tokens ({settings.max_new_tokens})")
    settings = dataclasses.replace(settings, device="cpu")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype(settings.weights_dtype)).eval()
        run_steps(model, settings, shapes, PhaseMarks(), lambda m: _generate(m, settings, shapes.prompt_tokens))
    return phase_peaks(prof.profiler.kineto_results.events())


class _Timed(PhaseMarks):
    """Each phase's wall time (a phase entered twice: the sum), the device synchronised around it."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds: dict[str, float] = {}

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._sync()
        start = time.perf_counter()
        with self._inside(name):
            yield
        self._sync()
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def _inside(self, name: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


class _CudaPeaks(_Timed):
    """Each phase's peak and starting bytes from CUDA's allocator statistics, and its wall time."""

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        self.peaks: dict[str, MeasuredPhase] = {}

    @contextlib.contextmanager
    def _inside(self, name: str) -> Iterator[None]:
        torch.cuda.reset_peak_memory_stats(self.device)
        start = torch.cuda.memory_allocated(self.device)
        yield
        torch.cuda.synchronize(self.device)
        phase = MeasuredPhase(torch.cuda.max_memory_allocated(self.device), start)
        if name not in self.peaks or phase.peak_bytes > self.peaks[name].peak_bytes:
            self.peaks[name] = phase


@dataclass(frozen=True)
class RealStep:
    """The real step on a device: each phase's peak, each phase's wall time (one group's
    generation), and the caching allocator's peak reserved bytes over the step."""

    peaks: dict[str, MeasuredPhase]
    seconds: dict[str, float]
    max_reserved: int

    @property
    def max_allocated(self) -> int:
        return max(p.peak_bytes for p in self.peaks.values())


def _check(settings: LLMTrainSettings) -> None:
    if settings.min_new_tokens != settings.max_new_tokens:
        raise ValueError("the measured step needs min_new_tokens = max_new_tokens")


def run_cuda(settings: LLMTrainSettings, config: Any, shapes: Shapes, device: str = "cuda") -> RealStep:
    """The same step on a CUDA device (every tensor made there): peaks, times, peak reserved.
    (``reset_peak_memory_stats`` at each phase also resets the reserved peak to what is reserved
    then; the caching allocator does not give segments back, so the last value is the step's peak.)"""
    from transformers import AutoModelForCausalLM

    _check(settings)
    target = torch.device(device)
    recorder = _CudaPeaks(target)
    with target:  # factory functions (the batches, the optimiser's state) make CUDA tensors
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype(settings.weights_dtype)).eval()
        run_steps(model, dataclasses.replace(settings, device=device), shapes, recorder,
                  lambda m: _generate(m, settings, shapes.prompt_tokens))
    torch.cuda.synchronize(target)
    return RealStep(recorder.peaks, recorder.seconds, torch.cuda.max_memory_reserved(target))


def measure_cuda(settings: LLMTrainSettings, config: Any, shapes: Shapes,
                 device: str = "cuda") -> dict[str, MeasuredPhase]:
    """Each phase's measured peak of the same step on a CUDA device (every tensor made there)."""
    return run_cuda(settings, config, shapes, device).peaks


def time_step(settings: LLMTrainSettings, config: Any, shapes: Shapes) -> dict[str, float]:
    """Each phase's wall time of the real step on the CPU (one group's generation)."""
    from transformers import AutoModelForCausalLM

    _check(settings)
    recorder = _Timed(torch.device("cpu"))
    settings = dataclasses.replace(settings, device="cpu")
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype(settings.weights_dtype)).eval()
    run_steps(model, settings, shapes, recorder, lambda m: _generate(m, settings, shapes.prompt_tokens))
    return recorder.seconds
