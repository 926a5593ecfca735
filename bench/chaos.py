"""A sweep logging to a real ``mlflow server`` through seeded random kills of its driver, its
trials and its tracking server; then, through the server, every (run, metric, step) that the
trials' ``result.json`` files hold must be in MLflow exactly once, every run FINISHED, one run
per trial (:func:`haepo_ray.tracking.audit.audit_sweep`).

    python bench/chaos.py --seed 0 --events 8 --trials 6 --iterations 30     # the short form
    python bench/chaos.py --seed 0 --events 50 --trials 96 --iterations 40   # the long form
    python bench/chaos.py --sweep llm --seed 1 --events 4                    # the language-model form

The sweep (``--sweep rl``): HAEPO on the 5-state chain MDP (tune_configs/smoke.yaml's), one
trial per seed, ``--slots`` at once on the driver's own Ray, iterations of at least
``--iteration-s`` (1 s: the sweep outlasts its events), a checkpoint every 3, ``max_failures``
20. ``--sweep llm``: tune_configs/llm_smoke.yaml's trials (HAEPO, GRPO and DPO on the tiny
language model, each seed, in the trial's own process, ``ray::ImplicitFunc``, which the next
trial reuses) and tracking (the final checkpoint and ``generations.jsonl`` uploaded too), with
the same slots, checkpoints and failures, and 30 updates where the smoke spec has 4: a fresh
trial process takes 10-30 s to start and an update 0.3-0.6 s, so with 4 every kill would land
in a start; with 30 a trial trains for 10-20 s, 10 checkpoints, and a kill can land between
two. Its step is the update, which a restored trial continues.

The events start once a trial has a checkpoint on storage (trials training, not starting: Tune
creates a trial's ``result.json`` when it starts it). Each event comes ``--min-gap``..``--max-gap``
s after the one before; the first three are one of each kind, in a random order, the rest random:

- ``driver``: SIGKILL of the driver's process group (and the Ray processes it started); then
  `haepo sweep --resume`, started once the server answers (a driver that starts while MLflow
  cannot be reached runs untracked: README, "MLflow that cannot be reached at start"). The
  kill waits for Tune's first state on storage (a resume needs one);
- ``trial``: SIGKILL of one running trial actor (``ray::HAEPO``, ``ray::ImplicitFunc``); Tune
  retries it from its newest checkpoint;
- ``server``: SIGKILL of the tracking server, once the driver's tracking has started; it is
  started again (its port, its store) ``--outage-min``..``--outage-max`` s later (5-30), while
  the sweep and the other events go on.

After the last event the server is up, the driver runs to its end (resumed again if it exits
with an error), and the audit runs. Prints one JSON object (the seed, each event, the audit);
exits 1 unless the audit is clean and every kind of event happened.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # helpers.MLflowServer

from helpers import LOGGED, MLflowServer  # noqa: E402

EXPERIMENT = "chaos"
KINDS = ("driver", "trial", "server")


# What each sweep (--sweep) runs: its spec, its trial actors' process title, its defaults.
SWEEPS = {
    "rl": {"spec": "smoke.yaml", "actor": "ray::HAEPO", "trials": 6, "iterations": 30, "iteration_s": 1.0},
    "llm": {"spec": "llm_smoke.yaml", "actor": "ray::ImplicitFunc", "trials": 6, "iterations": 30},
}
METHODS = ("HAEPO", "GRPO", "DPO")  # the language-model sweep's trials: each method on each seed
CHECKPOINT_EVERY = 3


def spec(args) -> dict:
    """The sweep's spec: ``args.sweep``'s smoke spec, ``args.trials`` trials of
    ``args.iterations`` iterations (RL updates), ``args.slots`` at once."""
    data = yaml.safe_load((REPO / "tune_configs" / SWEEPS[args.sweep]["spec"]).read_text())
    data.update(name=EXPERIMENT, stop={"iterations": args.iterations}, checkpoint_frequency=CHECKPOINT_EVERY,
                max_failures=20, max_concurrent_trials=args.slots, ray={"num_cpus": args.slots})
    if args.sweep == "llm":
        data["search_space"] = {"algorithm": {"grid": list(METHODS)},
                                "seed": {"grid": list(range(args.trials // len(METHODS)))}}
        data["settings"]["rl_updates"] = args.iterations
        return data
    data.update(search_space={"seed": {"grid": list(range(args.trials))}, "lr": {"grid": [0.05]}}, reuse_actors=False,
                tracking={"metrics": LOGGED, "log_checkpoints": False})
    data["settings"]["min_time_s_per_iteration"] = args.iteration_s
    return data


class Chaos:
    """The sweep's driver and server, and the events done to them."""

    def __init__(self, out: Path, args, draw: random.Random):
        self.out, self.args, self.draw = out, args, draw
        self.server = MLflowServer(out / "server")
        self.restart: threading.Thread | None = None
        self.restart_error: BaseException | None = None
        self.proc: subprocess.Popen | None = None
        self.log_path = out / "driver-00.log"
        self.drivers = 0
        self.t0 = time.monotonic()
        self.base = [sys.executable, "-m", "haepo_ray.cli", "sweep", str(out / "spec.yaml"), "--quiet",
                     "--tracking-uri", self.server.uri, "--storage-path", str(out / "results")]
        self.env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
        self.env["PYTHONUNBUFFERED"] = "1"

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 1)

    # ------------------------------------------------------------------ the driver

    def start_driver(self, resume: bool) -> None:
        self.wait_for_server()
        self.log_path = self.out / f"driver-{self.drivers:02d}.log"
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.base + (["--resume"] if resume else []), cwd=self.out, env=self.env,
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.drivers += 1

    def driver_tree(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return []

    def kill_driver(self) -> dict:
        """Waits for Tune's first state on storage (a resume needs one), then kills the group."""
        self.wait_until(lambda: bool(list((self.out / "results").glob(f"{EXPERIMENT}/*/experiment_state-*.json"))),
                        "Tune's first experiment state")
        tree = self.driver_tree()
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for p in tree:  # Ray's processes that left the group
            try:
                p.kill()
            except psutil.Error:
                pass
        checkpoints = self.checkpoints()
        self.start_driver(resume=True)
        return {"resumed_as": self.drivers - 1, "checkpoints_on_storage": checkpoints}

    def checkpoints(self) -> int:
        """The trials' checkpoints on storage (Tune writes each there at once)."""
        return len(list((self.out / "results").glob(f"{EXPERIMENT}/*/*/checkpoint_*")))

    # ------------------------------------------------------------------ a trial

    def trial_actors(self) -> list[psutil.Process]:
        actors = []
        for p in self.driver_tree():
            try:
                if p.cmdline() and p.cmdline()[0].startswith(SWEEPS[self.args.sweep]["actor"]):
                    actors.append(p)
            except psutil.Error:
                continue
        return sorted(actors, key=lambda p: p.pid)

    def kill_trial(self) -> dict:
        self.wait_until(lambda: bool(self.trial_actors()), "a running trial actor")
        actor = self.draw.choice(self.trial_actors())
        try:
            actor.kill()
        except psutil.Error as err:
            return {"actor": actor.pid, "error": str(err)}
        return {"actor": actor.pid}

    # ------------------------------------------------------------------ the server

    def kill_server(self) -> dict:
        """Once the driver's tracking has started (its parent run found or made), kills the
        server and starts it again later, on a thread."""
        self.wait_for_server()
        self.wait_until(lambda: "MLflow parent run:" in self.log_path.read_text(errors="replace"),
                        "the driver's MLflow parent run")
        self.server.stop()
        down_s = self.draw.uniform(self.args.outage_min, self.args.outage_max)

        def restart() -> None:
            time.sleep(down_s)
            try:
                self.server.start()
            except BaseException as err:  # reported, and the audit then fails
                self.restart_error = err

        self.restart = threading.Thread(target=restart, name="mlflow-restart", daemon=True)
        self.restart.start()
        return {"down_s": round(down_s, 1)}

    def wait_for_server(self) -> None:
        if self.restart is not None:
            self.restart.join()
            self.restart = None
        if self.restart_error is not None:
            raise RuntimeError(f"the tracking server did not start again: {self.restart_error}")

    # ------------------------------------------------------------------ the run

    def wait_until(self, ready, what: str, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if self.proc.poll() is not None:
                raise SweepEnded(f"the sweep ended while waiting for {what}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} in {timeout_s:.0f} s")
            time.sleep(0.2)

    def event(self, kind: str) -> dict:
        at = self.now()
        detail = {"driver": self.kill_driver, "trial": self.kill_trial, "server": self.kill_server}[kind]()
        return {"kind": kind, "at_s": at, **detail}

    def finish(self) -> list[int]:
        """Runs the sweep to its end with the server up; resumes a driver that ended with an
        error (at most 3 times). The drivers' exit codes."""
        self.wait_for_server()
        codes = [self.proc.wait()]
        while codes[-1] != 0 and len(codes) <= 3:
            self.start_driver(resume=True)
            codes.append(self.proc.wait())
        return codes

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            tree = self.driver_tree()
            os.killpg(self.proc.pid, signal.SIGKILL)
            for p in tree:
                try:
                    p.kill()
                except psutil.Error:
                    pass
        self.wait_for_server()
        self.server.kill()


class SweepEnded(Exception):
    pass


def schedule(draw: random.Random, events: int) -> list[str]:
    """One of each kind first, in a random order, then random kinds."""
    first = list(KINDS)
    draw.shuffle(first)
    return (first + [draw.choice(KINDS) for _ in range(max(0, events - len(KINDS)))])[:events]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", choices=sorted(SWEEPS), default="rl",
                        help="rl: HAEPO on the chain MDP; llm: HAEPO, GRPO and DPO on the tiny language model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--events", type=int, default=8)
    parser.add_argument("--trials", type=int, help="default 6 (llm: a multiple of 3, the methods)")
    parser.add_argument("--iterations", type=int, help="iterations (llm: RL updates) of a trial; default 30")
    parser.add_argument("--slots", type=int, default=2, help="trials at once (the driver's Ray CPUs)")
    parser.add_argument("--iteration-s", type=float, help="least seconds of an iteration (rl only; default 1)")
    parser.add_argument("--min-gap", type=float, default=3.0, help="least seconds between two events")
    parser.add_argument("--max-gap", type=float, default=12.0, help="most seconds between two events")
    parser.add_argument("--outage-min", type=float, default=5.0, help="least seconds the server stays down")
    parser.add_argument("--outage-max", type=float, default=30.0, help="most seconds the server stays down")
    parser.add_argument("--out", type=Path, help="work folder (default: a new temporary one)")
    args = parser.parse_args(argv)
    if args.sweep == "llm" and args.iteration_s is not None:
        parser.error("--iteration-s: the rl sweep's setting; an llm trial's update takes what it takes")
    for name in ("trials", "iterations", "iteration_s"):
        if getattr(args, name) is None:
            setattr(args, name, SWEEPS[args.sweep].get(name))
    if args.sweep == "llm" and (args.trials < len(METHODS) or args.trials % len(METHODS)):
        parser.error(f"--trials {args.trials}: the llm sweep runs {', '.join(METHODS)} on each seed; give a "
                     f"multiple of {len(METHODS)}")
    out = (args.out or Path(tempfile.mkdtemp(prefix="haepo-chaos-"))).resolve()
    (out / "server").mkdir(parents=True, exist_ok=True)
    (out / "spec.yaml").write_text(yaml.safe_dump(spec(args)))
    draw = random.Random(args.seed)
    kinds = schedule(draw, args.events)
    chaos = Chaos(out, args, draw)
    done: list[dict] = []
    ended_early = None
    try:
        chaos.start_driver(resume=False)
        chaos.wait_until(lambda: chaos.checkpoints() > 0, "a trial's first checkpoint")
        for kind in kinds:
            time.sleep(draw.uniform(args.min_gap, args.max_gap))
            if chaos.proc.poll() is not None:
                raise SweepEnded("the sweep ended before its events")
            done.append(chaos.event(kind))
            print(json.dumps(done[-1]), file=sys.stderr, flush=True)
        codes = chaos.finish()
    except SweepEnded as err:
        ended_early, codes = str(err), chaos.finish()
    try:
        report = audit(chaos, out)
    finally:
        chaos.close()
    happened = sorted({e["kind"] for e in done})
    ok = report["ok"] and happened == sorted(KINDS) and codes[-1] == 0
    print(json.dumps({"ok": ok, "sweep": args.sweep, "seed": args.seed, "events_asked": args.events,
                      "events_done": len(done), "kinds": happened, "ended_early": ended_early, "trials": args.trials,
                      "iterations": args.iterations, "driver_exit_codes": codes, "out": str(out),
                      "seconds": chaos.now(), "events": done, "audit": report}, indent=1))
    return 0 if ok else 1


def audit(chaos: Chaos, out: Path) -> dict:
    from mlflow.tracking import MlflowClient

    from haepo_ray.tracking.audit import audit_sweep

    from haepo_ray.sweep.kinds import load_plan

    plan = load_plan(out / "spec.yaml")
    client = MlflowClient(chaos.server.uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    parents = client.search_runs([exp.experiment_id], "tags.`haepo.role` = 'sweep'")
    (run_dir,) = (out / "results" / EXPERIMENT).iterdir()
    if len(parents) != 1:
        return {"ok": False, "parents": len(parents)}
    summary = json.loads((run_dir / "haepo_summary.json").read_text()) if (run_dir / "haepo_summary.json").exists() \
        else {"trials": []}
    ended = sorted({(t["status"], t["iterations"]) for t in summary["trials"]})
    report = audit_sweep(client, exp.experiment_id, parents[0].info.run_id, run_dir, plan.logged_metrics,
                         plan.step_key).summary()
    report["tune_trials"] = {"count": len(summary["trials"]), "status_and_iterations": ended}
    report["ok"] = report["ok"] and len(summary["trials"]) == chaos.args.trials \
        and ended == [("TERMINATED", chaos.args.iterations)] and report["trials"] == chaos.args.trials
    return report


if __name__ == "__main__":
    sys.exit(main())
