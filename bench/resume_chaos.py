"""An RL sweep whose driver is SIGKILLed again and again, each time resumed: with
``keep_checkpoints: 1`` (Tune deletes a trial's older checkpoint as it registers the next) every
trial must still end FINISHED, and MLflow hold every (run, metric, step) once, none missing.

    python bench/resume_chaos.py --seed 0                      # 20 kills of a 24-trial sweep
    python bench/resume_chaos.py --kills 3 --trials 4 --seed 1 # a short one

The sweep is tune_configs/smoke.yaml's (HAEPO on the 5-state chain MDP) with ``--trials`` seeds,
``--iterations`` iterations of at least 0.2 s each, a checkpoint every iteration and one kept.
Each driver (`haepo sweep`, embedded Ray, MLflow on SQLite) runs in its own process group; the
first starts the sweep, every next one resumes it (`--resume`). A driver is SIGKILLed (its whole
group) at a random moment: uniform in [``--min-s``, ``--max-s``] seconds after it logged its first
new row of ``time_total_s``. After ``--kills`` kills, a last resume runs the sweep to its end.
Prints one JSON object: the seed, each kill's moment, how many trials each resume restarted
without a deleted checkpoint, each trial's Tune and MLflow status, the rows, duplicates and
missing steps; exits 1 unless every trial finished with every row once.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from resume_duplicates import count, logged_updates

REPO = Path(__file__).resolve().parents[1]
KEY = "time_total_s"


def spec(trials: int, iterations: int) -> dict:
    data = yaml.safe_load((REPO / "tune_configs" / "smoke.yaml").read_text())
    data.update(name="chaos", search_space={"seed": {"grid": list(range(trials))}, "lr": {"grid": [0.05]}},
                stop={"iterations": iterations}, checkpoint_frequency=1, keep_checkpoints=1, max_failures=1,
                tracking={"metrics": [KEY, "training_iteration", "env_runners/episode_return_mean"],
                          "log_checkpoints": False})
    data["settings"]["min_time_s_per_iteration"] = 0.2
    return data


def drive(base: list[str], out: Path, number: int, kill_after: float | None, env: dict) -> dict:
    """Runs driver ``number`` to its end, or kills it ``kill_after`` s after its first new row."""
    args = base + (["--resume"] if number else [])
    log_path = out / f"driver-{number:02d}.log"
    db = out / "mlflow.db"
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(args, cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        rows = logged_updates(db, KEY)
        try:
            if kill_after is None:
                proc.wait()
            while proc.poll() is None and logged_updates(db, KEY) <= rows:
                time.sleep(0.1)
            deadline = time.monotonic() + (kill_after or 0)
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            killed = proc.poll() is None
            if killed:
                os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    text = log_path.read_text(errors="replace")
    return {"driver": number, "killed": killed, "kill_after_s": kill_after if killed else None, "exit": code,
            "seconds": round(time.monotonic() - start, 1), "rows_before": rows,
            "restarted_without_a_deleted_checkpoint": text.count("is not on storage"),
            "refused": "cannot resume" in text}


def missing_steps(db: Path, iterations: int) -> dict[str, list[int]]:
    """Per trial run and metric, the steps 1..iterations it lacks."""
    with sqlite3.connect(db) as conn:
        runs = [r for (r,) in conn.execute("select run_uuid from tags where key = 'mlflow.parentRunId'")]
        missing = {}
        for run in runs:
            for key in (KEY, "training_iteration"):
                steps = {s for (s,) in conn.execute("select distinct step from metrics where run_uuid = ? and key = ?",
                                                     (run, key))}
                lacking = sorted(set(range(1, iterations + 1)) - steps)
                if lacking:
                    missing[f"{run}/{key}"] = lacking
    return missing


def run_statuses(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("select r.status, t.value from runs r join tags t on t.run_uuid = r.run_uuid "
                            "and t.key = 'haepo.role'").fetchall()
    statuses: dict[str, int] = {}
    for status, role in rows:
        statuses[f"{role}:{status}"] = statuses.get(f"{role}:{status}", 0) + 1
    return statuses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--min-s", type=float, default=0.5, help="earliest kill after a driver's first new row")
    parser.add_argument("--max-s", type=float, default=6.0, help="latest kill after a driver's first new row")
    parser.add_argument("--out", type=Path, help="work folder (default: a new temporary one)")
    args = parser.parse_args()
    out = (args.out or Path(tempfile.mkdtemp(prefix="haepo-chaos-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.yaml").write_text(yaml.safe_dump(spec(args.trials, args.iterations)))
    base = [sys.executable, "-m", "haepo_ray.cli", "sweep", str(out / "spec.yaml"), "--quiet",
            "--tracking-uri", f"sqlite:///{out / 'mlflow.db'}", "--storage-path", str(out / "results")]
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    draw = random.Random(args.seed)
    drivers = []
    for number in range(args.kills + 1):
        kill_after = draw.uniform(args.min_s, args.max_s) if number < args.kills else None
        drivers.append(drive(base, out, number, kill_after, env))
        print(json.dumps(drivers[-1]), file=sys.stderr, flush=True)
        if not drivers[-1]["killed"]:
            break
    (run_dir,) = (out / "results" / "chaos").iterdir()
    summary = json.loads((run_dir / "haepo_summary.json").read_text()) if (run_dir / "haepo_summary.json").exists() \
        else {"trials": []}
    statuses = sorted({t["status"] for t in summary["trials"]})
    db = out / "mlflow.db"
    rows = count(db)
    missing = missing_steps(db, args.iterations)
    kills = sum(d["killed"] for d in drivers)
    ok = (kills == args.kills and drivers[-1]["exit"] == 0 and len(summary["trials"]) == args.trials
          and statuses == ["TERMINATED"] and run_statuses(db) == {"sweep:FINISHED": 1, "trial:FINISHED": args.trials}
          and rows["duplicates"] == 0 and not missing)
    import haepo_ray

    print(json.dumps({"ok": ok, "haepo_ray": str(Path(haepo_ray.__file__).parent), "seed": args.seed,
                      "kills": kills, "trials": args.trials, "iterations": args.iterations, "out": str(out),
                      "drivers": drivers, "tune_statuses": statuses, "mlflow_runs": run_statuses(db),
                      "rows": rows["rows"], "duplicates": rows["duplicates"], "missing": missing}, indent=1))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
