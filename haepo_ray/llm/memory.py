"""Peak memory per training phase (generation, reference pass, forward/backward, optimiser step).

On CUDA: ``torch.cuda.reset_peak_memory_stats`` before a phase, ``max_memory_allocated`` and
``max_memory_reserved`` after it. On CPU: the process's resident-set high-water mark, reset by
writing 5 to ``/proc/self/clear_refs`` and read as ``VmHWM`` from ``/proc/self/status``
(Linux); it counts the whole process (weights, optimiser state, Python), not only the phase's
tensors, so CPU figures compare methods only when everything else is equal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch

from haepo_ray import names

__all__ = ["PHASES", "PeakMemory"]

PHASES: tuple[str, ...] = names.LLM_MEMORY_PHASES  # the report orders its memory bars by them
_MB = 1024 * 1024


def _cpu_high_water_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / _MB  # the value is in kB
    raise RuntimeError("/proc/self/status has no VmHWM line")


def _reset_cpu_high_water() -> None:
    Path("/proc/self/clear_refs").write_text("5")


class PeakMemory:
    """Records each phase's peak: ``with peaks.phase("generation"): ...``, then ``peaks.allocated``.

    ``allocated`` holds the peak in MB per phase (CUDA: allocated tensors; CPU: VmHWM) and
    ``reserved`` the CUDA allocator's reserved peak (on CPU the same as ``allocated``). A phase
    entered twice keeps the larger peak.
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.allocated: dict[str, float] = {}
        self.reserved: dict[str, float] = {}
        if self.device.type == "cpu" and not Path("/proc/self/clear_refs").exists():
            raise RuntimeError("CPU peak memory needs Linux's /proc/self/clear_refs")

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            _reset_cpu_high_water()
        yield
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            allocated = torch.cuda.max_memory_allocated(self.device) / _MB
            reserved = torch.cuda.max_memory_reserved(self.device) / _MB
        else:
            allocated = reserved = _cpu_high_water_mb()
        self.allocated[name] = max(allocated, self.allocated.get(name, 0.0))
        self.reserved[name] = max(reserved, self.reserved.get(name, 0.0))
