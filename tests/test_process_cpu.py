"""bench/process_cpu.py: every Python process a command starts is counted, under its kind."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
_spec = importlib.util.spec_from_file_location("process_cpu", BENCH / "process_cpu.py")
process_cpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(process_cpu)


@pytest.mark.parametrize("title, argv, kind", [
    ("ray::HAEPO.train", "", "Ray actor HAEPO"),
    ("ray::IDLE", "", "Ray idle worker"),
    ("/v/bin/python /v/bin/mlflow server --host 127.0.0.1", "", "MLflow server"),
    ("/v/bin/python -m uvicorn --log-config x mlflow.server.fastapi_app:app", "", "MLflow server"),
    ("/v/bin/python -u /v/site-packages/ray/_private/log_monitor.py", "", "Ray daemons"),
    ("/v/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))", "-c", "pytest and its workers"),
    ("/v/bin/python -m haepo_ray.cli sweep a.yaml", "-m sweep a.yaml", "haepo sweep"),
    ("/v/bin/python /v/bin/haepo report x", "/v/bin/haepo report x", "haepo report"),
    ("/v/bin/python -c from haepo_ray.cli import main", "-c", "python -c (a test's own subprocess)"),
])
def test_a_process_is_counted_under_its_kind(title, argv, kind):
    assert process_cpu.kind(title, argv) == kind


def test_a_child_and_its_child_are_counted_with_their_cpu(tmp_path):
    """The command's Python child starts a grandchild that spins for 1 s of CPU: both are
    counted, the grandchild with at least most of its second."""
    spin = "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end: pass\n"
    (tmp_path / "spin.py").write_text(spin)
    parent = f"import subprocess, sys; subprocess.run([sys.executable, {str(tmp_path / 'spin.py')!r}], check=True)"
    out = tmp_path / "cpu.json"
    proc = subprocess.run([sys.executable, str(BENCH / "process_cpu.py"), str(out), "--", sys.executable, "-c", parent],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    table = json.loads(out.read_text())
    kinds = {row["kind"]: row for row in table["kinds"]}
    assert kinds["other: python"]["processes"] == 1  # spin.py
    assert 0.8 <= kinds["other: python"]["cpu_s"] <= table["machine_busy_cpu_s"]
    assert kinds["python -c (a test's own subprocess)"]["processes"] == 1
    assert "machine busy" in proc.stdout and "other: python" in proc.stdout


def test_a_forked_child_that_exits_last_leaves_its_parents_sample(tmp_path):
    """A forked child inherits the probe's exit hook (not its thread) and its file name: its
    exit, after the parent's, wrote its own near-zero CPU over the parent's 1 s."""
    parent = tmp_path / "parent.py"
    parent.write_text("import os, sys, time\nend = time.process_time() + 1.0\nwhile time.process_time() < end: pass\n"
                      "if os.fork() == 0:\n    time.sleep(0.5)\n    sys.exit(0)\n")
    out = tmp_path / "cpu.json"
    proc = subprocess.run([sys.executable, str(BENCH / "process_cpu.py"), str(out), "--", "sh", "-c",
                           f"{sys.executable} {parent} && sleep 1.5"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    (row,) = [r for r in json.loads(out.read_text())["kinds"] if r["kind"] == "other: python"]
    assert row["processes"] == 1 and row["cpu_s"] >= 0.8, row


def test_a_failing_command_gives_its_exit_code(tmp_path):
    proc = subprocess.run([sys.executable, str(BENCH / "process_cpu.py"), str(tmp_path / "cpu.json"), "--",
                           sys.executable, "-c", "raise SystemExit(3)"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert json.loads((tmp_path / "cpu.json").read_text())["exit"] == 3


def test_no_command_is_a_usage_error(tmp_path):
    out = tmp_path / "cpu.json"
    proc = subprocess.run([sys.executable, str(BENCH / "process_cpu.py"), str(out), "--"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "no command given (put it after --)" in proc.stderr
    assert not out.exists()
