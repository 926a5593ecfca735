"""Peak memory per phase on CPU: the process high-water mark, reset between phases."""

from __future__ import annotations

import torch

from haepo_ray.llm.memory import PeakMemory


def test_cpu_phase_peaks_see_a_transient_allocation_only_in_its_phase():
    peaks = PeakMemory("cpu")
    with peaks.phase("generation"):
        big = torch.ones(64 * 1024 * 1024 // 4)  # 64 MB, touched
        del big
    with peaks.phase("optimizer"):
        small = torch.ones(16)
        del small
    # The high-water mark was reset before "optimizer": the freed 64 MB is not counted there.
    assert peaks.allocated["generation"] - peaks.allocated["optimizer"] > 60
    assert peaks.reserved == peaks.allocated
    with peaks.phase("generation"):
        pass
    assert peaks.allocated["generation"] - peaks.allocated["optimizer"] > 60  # the larger peak is kept
