"""bench/gpu_sweep_check.py --device cpu: every row but the CUDA one, here, with Ray told it has
one GPU (the GPU run's table is in BENCHMARKS.md), and with only the modules the GPU machine has
(bench/gpu_image.py) and the data it gets (bench/gpu_assets.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import bench_module, run_tree

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_gpu_sweep_check_passes_on_the_cpu_with_the_gpu_machines_modules(tmp_path):
    assets, out = tmp_path / "gpu", tmp_path / "out"
    for step in ("pack", "finish"):  # here, then there: the encoder's stand-in gets random weights
        subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_assets.py"), step, str(assets)], check=True)
    env = bench_module("gpu_image").emulate(tmp_path / "image", {**os.environ, "PYTHONPATH": str(assets / "site")})
    proc = run_tree([sys.executable, str(ROOT / "bench" / "gpu_sweep_check.py"), str(out), "--device", "cpu",
                     "--data", f"tldr:{assets / 'aclsum.jsonl'}"], timeout=900, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((out / "gpu_sweep_check.json").read_text())["rows"]
    assert list(rows) == ["rl_learners", "rl_iteration_time", "loss_cuda_vs_cpu", "lm_refused", "lm_packed",
                          "ray_gpu_assignment"]
    assert rows.pop("loss_cuda_vs_cpu")["passed"] is None  # skipped: no CUDA
    assert all(row["passed"] for row in rows.values()), rows
    # each row saw what it reports: 4 RL trials on the CPU, the refusal's numbers, 6 LM trials, their shares
    assert [t["learner"] for t in rows["rl_learners"]["trials"]] == ["cpu"] * 4
    assert rows["rl_iteration_time"]["cpu_learner_s"] > 0
    assert rows["lm_refused"]["rc"] == 2 and "GiB" in rows["lm_refused"]["refusal"][0]
    assert [t["status"] for t in rows["lm_packed"]["trials"]] == ["FINISHED"] * 6
    assert all(0 < share < 0.5 for share in rows["lm_packed"]["shares"])  # two or more fit one GPU
    table = (out / "gpu_sweep_check.md").read_text()
    assert "| loss_cuda_vs_cpu | HAEPO's loss and gradients on CUDA equal the CPU's | skipped |" in table
    assert table.count("| pass |") == 5
