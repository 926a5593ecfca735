"""bench/chaos.py's short form: 8 seeded random events, each kind among them (driver group
SIGKILL and --resume, a trial actor SIGKILL, the tracking server SIGKILLed and started again),
then every (run, metric, step) of the trials' result.json in MLflow exactly once (a run may also
hold a step that a kill left out of result.json: haepo_ray/tracking/audit.py). Its long form (50
events over 96 trials) is for BENCHMARKS.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_short_chaos_loses_nothing(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "chaos.py"), "--seed", "0", "--events", "8",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["events_done"] == 8 and report["kinds"] == ["driver", "server", "trial"], report
    audit = report["audit"]
    assert (audit["missing"], audit["duplicates"]) == (0, 0), audit
    assert audit["rows_on_disk"] > 0 and audit["trials"] == 6, audit
    assert proc.returncode == 0 and report["ok"], report
