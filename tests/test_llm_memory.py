"""Peak memory per phase on CPU: the process high-water mark, reset between phases."""

from __future__ import annotations

import subprocess
import sys

# In a fresh interpreter: after other tests in the same process, a freed 64 MB may be served
# again from memory already resident (the allocator keeps it), and the high-water mark would
# not move; what is checked is the reset between phases.
CHECK = """
import torch
from haepo_ray.llm.memory import PeakMemory
peaks = PeakMemory("cpu")
with peaks.phase("generation"):
    big = torch.ones(64 * 1024 * 1024 // 4)  # 64 MB, touched
    del big
with peaks.phase("optimizer"):
    small = torch.ones(16)
    del small
first = peaks.allocated["generation"] - peaks.allocated["optimizer"]
assert peaks.reserved == peaks.allocated
with peaks.phase("generation"):
    pass
print(first, peaks.allocated["generation"] - peaks.allocated["optimizer"])
"""


def test_cpu_phase_peaks_see_a_transient_allocation_only_in_its_phase():
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    first, again = map(float, proc.stdout.split())
    # The high-water mark was reset before "optimizer": the freed 64 MB is not counted there.
    assert first > 60
    assert again > 60  # a phase entered twice keeps the larger peak
