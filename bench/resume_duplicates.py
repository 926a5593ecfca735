"""A language-model sweep whose driver is killed mid-run, then resumed: how many (run, metric,
step) rows MLflow holds more than once (BENCHMARKS.md, "Exactly once").

    python bench/resume_duplicates.py                       # tune_configs/llm_smoke.yaml, 400 updates, one
                                                            # seed, checkpoints every 2, killed at update 30
    PYTHONPATH=/tmp/old python bench/resume_duplicates.py   # the same with another checkout's haepo_ray

The first driver (`haepo sweep`, embedded Ray, a SQLite store) runs in its own process group
and is SIGKILLed once the store holds ``--kill-at`` updates of the first trial (HAEPO) (the
issue killed it 25 s in, at update 30; start-up time varies with the machine's load);
`haepo sweep --resume` then runs the sweep to its end. Prints one JSON object: per trial's run, its algorithm, rows, distinct steps and
duplicate rows per metric, and the totals.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def logged_updates(db: Path, key: str = "reward_mean") -> int:
    """Rows of ``key`` in the store (reward_mean: the first trial's updates while it runs alone)."""
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            return conn.execute("select count(*) from metrics where key = ?", (key,)).fetchone()[0]
    except sqlite3.Error:  # not created yet, or busy
        return 0


def run(spec: Path, out: Path, kill_at: int) -> float:
    """Runs, kills and resumes the sweep; returns the resumed driver's seconds."""
    base = [sys.executable, "-m", "haepo_ray.cli", "sweep", str(spec), "--quiet",
            "--tracking-uri", f"sqlite:///{out / 'mlflow.db'}", "--storage-path", str(out / "results")]
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    with open(out / "first.log", "w") as log:
        first = subprocess.Popen(base, cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        while first.poll() is None and logged_updates(out / "mlflow.db") < kill_at:
            time.sleep(0.1)
        if first.poll() is not None:
            raise SystemExit(f"the sweep ended before update {kill_at}: see {out / 'first.log'}")
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    start = time.monotonic()
    with open(out / "resumed.log", "w") as log:
        subprocess.run([*base, "--resume"], cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    return time.monotonic() - start


def count(db: Path) -> dict:
    """Rows and duplicates per (trial run, metric) of the store's trial runs."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "select m.run_uuid, t.value, m.key, count(*), count(distinct m.step) from metrics m "
            "join tags t on t.run_uuid = m.run_uuid and t.key = 'haepo.algorithm' "
            "where m.run_uuid in (select run_uuid from tags where key = 'mlflow.parentRunId') "
            "group by m.run_uuid, t.value, m.key").fetchall()
    runs: dict[str, dict] = {}
    for run_id, algorithm, key, n, steps in rows:
        entry = runs.setdefault(run_id, {"algorithm": algorithm, "rows": 0, "duplicates": {}})
        entry["rows"] += n
        entry["steps"] = max(entry.get("steps", 0), steps)
        if n > steps:
            entry["duplicates"][key] = n - steps
    return {"runs": runs, "rows": sum(r["rows"] for r in runs.values()),
            "duplicates": sum(sum(r["duplicates"].values()) for r in runs.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=400)
    parser.add_argument("--checkpoint-frequency", type=int, default=2)
    parser.add_argument("--kill-at", type=int, default=30, help="logged updates before the SIGKILL")
    parser.add_argument("--out", type=Path, help="work folder (default: a new temporary one)")
    args = parser.parse_args()
    out = (args.out or Path(tempfile.mkdtemp(prefix="haepo-resume-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    spec = yaml.safe_load((REPO / "tune_configs" / "llm_smoke.yaml").read_text())
    spec["search_space"]["seed"] = {"grid": [0]}
    spec["settings"]["rl_updates"] = args.updates
    spec["checkpoint_frequency"] = args.checkpoint_frequency
    (out / "spec.yaml").write_text(yaml.safe_dump(spec))
    seconds = run(out / "spec.yaml", out, args.kill_at)
    import haepo_ray

    print(json.dumps({"haepo_ray": str(Path(haepo_ray.__file__).parent), "updates": args.updates,
                      "killed_at_update": args.kill_at, "resumed_s": round(seconds), **count(out / "mlflow.db")},
                     indent=1))


if __name__ == "__main__":
    main()
