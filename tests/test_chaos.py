"""bench/chaos.py's short forms: seeded random events, each kind among them (driver group
SIGKILL and --resume, a trial actor SIGKILL, the tracking server SIGKILLed and started again),
then every (run, metric, step) of the trials' result.json in MLflow exactly once (a run may also
hold a step that a kill left out of result.json: haepo_ray/tracking/audit.py). The RL form: 8
events over 6 chain-MDP trials; the language-model form: 4 events over llm_smoke.yaml's 6
trials (seed 1: a trial, the server, the driver while the server is down, so its writer lags,
then a trial of the resumed driver). The long form (50 events over 96 trials) is for
BENCHMARKS.md."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import run_tree

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize(("args", "events"), [
    (["--seed", "0", "--events", "8"], 8),
    (["--sweep", "llm", "--seed", "1", "--events", "4"], 4),
], ids=["rl", "llm"])
def test_the_short_chaos_loses_nothing(args, events, tmp_path):
    proc = run_tree([sys.executable, str(ROOT / "bench" / "chaos.py"), *args, "--out", str(tmp_path)],
                    timeout=1200, cwd=ROOT)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["events_done"] == events and report["kinds"] == ["driver", "server", "trial"], report
    audit = report["audit"]
    assert (audit["missing"], audit["duplicates"]) == (0, 0), audit
    assert audit["rows_on_disk"] > 0 and audit["trials"] == 6, audit
    assert proc.returncode == 0 and report["ok"], report
