"""bench/gpu_check.py runs where only PyTorch, transformers and peft are installed: here, on the
CPU and the tiny model, with Ray, MLflow, gymnasium and trl hidden from the import system."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import bench_module

from haepo_ray.llm.capacity.steps import RL_PHASES

ROOT = Path(__file__).resolve().parents[1]
HIDDEN = ("ray", "mlflow", "gymnasium", "trl")

# Every finder answers "no such module" for the hidden top-level names (as where they are not
# installed); the script runs as __main__; at the end, none of them may have been imported.
HIDE = bench_module("gpu_image").hiding(HIDDEN)
RUN = """
import runpy
sys.argv = [{script!r}, *{args!r}]
try:
    runpy.run_path({script!r}, run_name="__main__")
finally:
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in HIDDEN)
    print("HIDDEN LOADED:", loaded)
"""


def _run(args: list[str]) -> subprocess.CompletedProcess:
    code = HIDE + RUN.format(script=str(ROOT / "bench" / "gpu_check.py"), args=args)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_the_wrapper_hides_the_modules():
    code = HIDE + "import importlib.util\nprint(importlib.util.find_spec('ray'))\nimport ray\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "None"
    assert "ModuleNotFoundError: No module named 'ray'" in proc.stderr


CONFIGS = ("as given", "one pass", "LoRA", "checkpointing", "static decoding", "static, batch generation",
           "stochastic rounding")
ALGOS = ("HAEPO", "GRPO", "DPO")


@pytest.fixture(scope="module")
def cpu_check(tmp_path_factory):
    """Every configuration of HAEPO (8 of the 22 rows). GRPO's and
    DPO's rows run the same ``check`` with another algorithm: their simulated and measured steps
    are test_llm_capacity's (every algorithm), and the full run is the slow tier's
    test_gpu_check_writes_every_row."""
    out = tmp_path_factory.mktemp("gpu_check")
    proc = _run([str(out), "--device", "cpu", "--model", "tiny", "--algo", "HAEPO"])
    return out, proc


def test_gpu_check_runs_without_ray_mlflow_gymnasium_or_trl(cpu_check):
    _, proc = cpu_check
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "HIDDEN LOADED: []" in proc.stdout


def _check_rows(out: Path, proc: subprocess.CompletedProcess, algos: tuple[str, ...]) -> None:
    """One row per configuration and algorithm of ``algos`` (the planned fit HAEPO's only), in
    that order, with finite numbers, in the JSON and in the table."""
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "gpu_check.json").read_text())
    assert (result["device"], result["model"]) == ("cpu", "tiny")
    assert result["torch"] and result["transformers"] and result["device_name"]
    rows = result["rows"]
    expected = [(c, a) for c in CONFIGS for a in algos] + [("planned fit", "HAEPO")]
    assert [(r["config"], r["algo"]) for r in rows] == expected
    numbers = ("simulated_allocated", "measured_allocated", "allocated_ratio", "simulated_reserved",
               "measured_reserved", "reserved_ratio", "update_s", "roofline_s", "time_ratio", "new_tokens_per_s")
    for r in rows:
        assert all(math.isfinite(r[k]) and r[k] > 0 for k in numbers), r
        assert r["allocated_ratio"] == r["simulated_allocated"] / r["measured_allocated"]
        assert r["time_ratio"] == r["update_s"] / r["roofline_s"]
    table = (out / "gpu_check.md").read_text().splitlines()
    body = [line for line in table if line.startswith("| ") and not line.startswith("| config")]
    assert [tuple(line.split(" | ")[:2]) for line in body] == [(f"| {c}", a) for c, a in expected]
    assert all(len(line.split(" | ")) == 13 for line in body)


def test_gpu_check_writes_one_row_per_configuration_with_finite_numbers(cpu_check):
    _check_rows(*cpu_check, algos=("HAEPO",))


@pytest.mark.slow
def test_gpu_check_writes_every_row(tmp_path):
    """The script's default run: all 22 rows, every algorithm in every configuration."""
    proc = _run([str(tmp_path), "--device", "cpu", "--model", "tiny"])
    _check_rows(tmp_path, proc, algos=ALGOS)


def test_each_configuration_runs_with_its_settings(cpu_check):
    out, _ = cpu_check
    rows = {(r["config"], r["algo"]): r for r in json.loads((out / "gpu_check.json").read_text())["rows"]}
    given = rows["as given", "HAEPO"]
    assert (given["micro_batch_size"], given["lora_r"], given["gradient_checkpointing"]) == (2, 0, False)
    assert rows["one pass", "HAEPO"]["micro_batch_size"] == 0
    assert rows["LoRA", "HAEPO"]["lora_r"] == 2
    assert rows["LoRA", "HAEPO"]["measured_allocated"] < given["measured_allocated"]
    assert rows["checkpointing", "HAEPO"]["gradient_checkpointing"]
    assert (given["decoding"], rows["static decoding", "HAEPO"]["decoding"]) == ("dynamic", "static")
    assert (given["rounding"], rows["stochastic rounding", "HAEPO"]["rounding"]) == ("nearest", "stochastic")
    # an update's time: its generate calls, one measured (2 prompts' groups, or both in one), and the rest
    batched = rows["static, batch generation", "HAEPO"]
    assert batched["decoding"] == "static" and batched["new_tokens_per_s"] > 0
    for row, calls in ((given, 2), (batched, 1)):
        assert row["update_s"] == sum(row["phase_s"][p] * (calls if p == "generation" else 1) for p in RL_PHASES)
    # planned from the whole update in one pass against a limit below it: the plan changed it
    planned = rows["planned fit", "HAEPO"]
    assert (planned["micro_batch_size"], planned["gradient_checkpointing"]) != (0, False)
    assert planned["simulated_reserved"] < rows["one pass", "HAEPO"]["simulated_reserved"]
