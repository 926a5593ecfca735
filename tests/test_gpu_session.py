"""bench/gpu_session.sh, the glue of a GPU session, against what it drives: its two device calls
run every row of bench/gpu_sweep_check.py within their timeouts, its decoding configurations are
bench/gpu_check.py's, and BENCHMARKS.md gives the same calls. (The session itself needs the
wheelhouse and a GPU: rehearsed by hand, BENCHMARKS.md "GPU sweep check".)"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from helpers import bench_module

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_session.sh"
KILL_GRACE_S = 10  # run's `timeout -k 10`: a step cut at the budget may take this much longer


def _calls() -> list[tuple[int, str]]:
    """(timeout_s, command) of each device call ``gpu_session.sh calls`` prints."""
    out = subprocess.run(["bash", str(SCRIPT), "calls"], capture_output=True, text=True, check=True).stdout
    timeouts = [int(t) for t in re.findall(r"timeout_s (\d+)", out)]
    commands = [line.strip() for line in out.splitlines() if line.startswith("  ")]
    assert len(timeouts) == len(commands) == 2, out
    return list(zip(timeouts, commands, strict=True))


def test_the_device_calls_run_every_row_once_decode_once_and_end_within_their_timeouts():
    rows = bench_module("gpu_sweep_check").ROWS
    ran: list[str] = []
    decodes = 0
    for timeout_s, command in _calls():
        words = shlex.split(command)
        settings = dict(w.split("=", 1) for w in words if re.fullmatch(r"[A-Z_]+=.*", w))
        args = [w for w in words if "=" not in w]
        assert args[:4] == ["bash", "bench/gpu_session.sh", "run", "$OUT"], command
        budget = int(args[4])
        assert budget + KILL_GRACE_S < timeout_s, command  # the run ends before the device call's limit
        assert set(settings) <= {"ROWS", "DECODE_S"}, command
        unknown = [r for r in settings["ROWS"].split() if r not in rows]
        assert not unknown, f"{command}: no such rows in gpu_sweep_check.py: {unknown}"
        ran += settings["ROWS"].split()
        decodes += settings.get("DECODE_S", "240") != "0"
    assert set(ran) == set(rows)  # ray_gpu_assignment runs in both: over every sweep made so far
    assert decodes == 1


def test_the_decoding_configurations_are_gpu_checks():
    configs = bench_module("gpu_check").CONFIGS
    named = re.findall(r'--config((?: "[^"]+")+)', SCRIPT.read_text())
    assert len(named) == 1
    assert [c for c in shlex.split(named[0]) if c not in configs] == []
    assert len(shlex.split(named[0])) == 3


def test_benchmarks_gives_the_same_device_calls():
    benchmarks = (ROOT / "BENCHMARKS.md").read_text()
    missing = [command for _, command in _calls() if command not in benchmarks]
    assert not missing, f"BENCHMARKS.md does not give the device calls {missing} (bench/gpu_session.sh calls)"


def test_the_script_parses_and_says_how_to_use_it():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    usage = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
    assert usage.returncode == 2
    assert [sub for sub in ("prepare", "run OUT [S]", "calls") if f"gpu_session.sh {sub}" not in usage.stderr] == []
