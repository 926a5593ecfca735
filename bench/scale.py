"""A sweep of N one-iteration HAEPO trials through `haepo sweep`'s own code path
(:func:`haepo_ray.sweep.runner.run_sweep`), with MLflow on a real ``mlflow server``: how the
orchestration scales to thousands of trials, and whether MLflow holds every row exactly once.
Results: BENCHMARKS.md, "Sweeps of thousands of trials".

    python bench/scale.py --trials 1000 --slots 8                   # SQLite store
    python bench/scale.py --trials 300 --slots 2 --backend postgresql
    python bench/scale.py --trials 200 --kill-at 0.5 [--reference]   # `haepo sweep` killed, resumed
    python bench/scale.py --trials 200 --outage-s 20 --outage-at 0.3 # the MLflow server down 20 s
    python bench/scale.py --trials 300 --slots 2 --profile           # cProfile: driver and actors
    python bench/scale.py --trials 150 --slots 2 --ab /tmp/base .    # A/B: the haepo_ray of each folder

Each trial: the 10-arm Gaussian bandit (8 envs, M = 8 episodes per update, ``fcnet_hiddens``
[16], no env runners), ``stop: {iterations: 1}``, no checkpoints, ``reuse_actors: true``; the
grid is lr x seed. Ray is started here with ``--slots`` CPUs, more than the machine has, so
that Tune runs that many trials at once (``run_sweep`` reuses an initialised Ray; in
``--kill-at`` mode the spec's ``ray: {num_cpus: S}`` does it).

What one run records (JSON in .haepo/bench/, one summary line on stdout):

- wall time of the sweep; the *minimum*: the trials' own compute, the sum of each trial's
  ``time_total_s``, divided by the slots, and the CPU-bound minimum: that sum divided by the
  machine's cores; wall / minimum; seconds per trial per slot (wall * slots / N) and per core;
- the driver's RSS at start, every 500 finished trials and at the end (growth per trial);
- CPU seconds of the driver, Ray's actors, Ray's own processes, the MLflow server (and
  PostgreSQL), sampled every second with psutil;
- the MLflow writer's queue depth every second (``callback.backlog()`` when the callback has
  one, else its writer's queue size);
- what the store holds, counted in SQL: child runs, runs per trial, statuses, rows per (run,
  metric, step): every run's metrics at step 1 exactly once;
- ``haepo report`` on the experiment: seconds and peak RSS (``/usr/bin/time -v``), with a
  time limit (``--report-timeout``).

Modes: ``--kill-at F`` runs ``haepo sweep SPEC`` as a subprocess in its own process group,
SIGKILLs the group once Tune has finished F*N trials (``--kill-by mlflow``: once the store
holds F*N finished child runs; the writer may be far behind Tune), then runs ``haepo sweep SPEC
--resume`` to the end (``--reference``: an uninterrupted run of the same N first, for the
time of the same second part). ``--outage-s S --outage-at F`` SIGKILLs the MLflow server once
F*N trials finished and restarts it on the same port and store S seconds later.
``--profile`` profiles the driver's main thread (cProfile) and, in every trial actor, the
trainable's reset (algorithm stop + build), its iterations and a cProfile of the actor.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # helpers.MLflowServer, test_postgres.PostgresCluster

from helpers import MLflowServer  # noqa: E402
from sweep_throughput import Timeline, load, split_overhead  # noqa: E402  (bench/ is on the path)

EXPERIMENT = "scale"
CORE_METRICS = ("training_iteration", "time_total_s", "env_runners/episode_return_mean")
RSS_EVERY = 500  # finished trials between two RSS records
LRS = (1e-3, 2e-3, 5e-3, 1e-2)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def spec_data(n: int, slots: int) -> dict:
    """The sweep: N trials as lr x seed (as many lr values of :data:`LRS` as divide N)."""
    k = next(k for k in (4, 2, 1) if n % k == 0)
    return {
        "name": EXPERIMENT,
        "algorithm": "HAEPO",
        "env": "haepo/GaussianBandit-v0",
        "env_config": {"num_arms": 10},
        "settings": {"num_env_runners": 0, "num_envs_per_env_runner": 8, "batch_size": 8,
                     "model_config": {"fcnet_hiddens": [16]}, "beta_ent": 0.05, "beta_kl": 0.05},
        "search_space": {"lr": {"grid": list(LRS[:k])}, "seed": {"grid": list(range(n // k))}},
        "search": {"algorithm": "grid"},
        "metric": "env_runners/episode_return_mean",
        "mode": "max",
        "stop": {"iterations": 1},
        "resources": {"cpus": 1, "gpus": 0},
        "reuse_actors": True,
        "checkpoint_frequency": 0,
        "checkpoint_at_end": False,
        "max_failures": 0,
        "tracking": {"log_checkpoints": False},
        "ray": {"num_cpus": slots},
    }


# --------------------------------------------------------------------------- the store


class Store:
    """The MLflow server's backend, read directly in SQL (SQLite file or PostgreSQL)."""

    def __init__(self, sqlite_db: Path | None = None, postgres=None):
        self.sqlite_db, self.postgres = sqlite_db, postgres

    def rows(self, query: str, *params) -> list:
        if self.postgres is not None:
            return self.postgres.sql("mlflow", query, *params)
        if not self.sqlite_db.exists():
            return []
        with sqlite3.connect(f"file:{self.sqlite_db}?mode=ro", uri=True, timeout=30) as conn:
            return conn.execute(query.replace("%s", "?"), params).fetchall()

    _CHILDREN = ("from runs r join experiments e on e.experiment_id = r.experiment_id "
                 "join tags p on p.run_uuid = r.run_uuid and p.key = 'mlflow.parentRunId' "
                 "where e.name = %s and r.lifecycle_stage = 'active'")

    def finished_children(self) -> int:
        try:
            return self.rows(f"select count(*) {self._CHILDREN} and r.status = 'FINISHED'", EXPERIMENT)[0][0]
        except Exception:  # busy, or not created yet
            return 0

    def count(self, n: int) -> dict:
        """What the store holds of the sweep's trials: child runs, runs per trial, statuses,
        rows per (run, metric, step)."""
        runs = self.rows(
            "select r.run_uuid, r.status, t.value from runs r "
            "join experiments e on e.experiment_id = r.experiment_id "
            "join tags p on p.run_uuid = r.run_uuid and p.key = 'mlflow.parentRunId' "
            "left join tags t on t.run_uuid = r.run_uuid and t.key = 'haepo.trial_id' "
            "where e.name = %s and r.lifecycle_stage = 'active'", EXPERIMENT)
        metric_rows = self.rows(
            "select m.run_uuid, m.key, m.step, count(*) from metrics m "
            "join runs r on r.run_uuid = m.run_uuid join experiments e on e.experiment_id = r.experiment_id "
            "where e.name = %s group by m.run_uuid, m.key, m.step", EXPERIMENT)
        child_ids = {r[0] for r in runs}
        per_trial = Counter(r[2] for r in runs)
        step1: dict[str, set] = {}
        duplicates, other_steps, total = 0, 0, 0
        for run, key, step, count in metric_rows:
            if run not in child_ids:
                continue
            total += count
            duplicates += count - 1
            if step == 1:
                step1.setdefault(run, set()).add(key)
            else:
                other_steps += count
        expected = set(CORE_METRICS).union(*step1.values()) if step1 else set(CORE_METRICS)
        missing = {run: sorted(expected - step1.get(run, set())) for run in child_ids}
        missing = {run: keys for run, keys in missing.items() if keys}
        time_total = [v for (v,) in self.rows(
            "select m.value from metrics m join runs r on r.run_uuid = m.run_uuid "
            "join experiments e on e.experiment_id = r.experiment_id "
            "where e.name = %s and m.key = 'time_total_s' and m.step = 1", EXPERIMENT)]
        return {
            "child_runs": len(runs),
            "trials_with_a_run": len(per_trial),
            "trials_missing_a_run": max(0, n - len(per_trial)),
            "trials_with_more_than_one_run": sum(1 for c in per_trial.values() if c > 1),
            "statuses": dict(Counter(r[1] for r in runs)),
            "expected_metrics_per_run": len(expected),
            "metric_rows": total,
            "missing_rows_in_runs": sum(len(k) for k in missing.values()),
            # with the rows of the trials that have no run at all
            "missing_rows": sum(len(k) for k in missing.values()) + max(0, n - len(per_trial)) * len(expected),
            "runs_missing_rows": len(missing),
            "missing_examples": dict(list(missing.items())[:3]),
            "duplicate_rows": duplicates,
            "rows_at_other_steps": other_steps,
            "sum_time_total_s_in_store": sum(time_total),
            "ok": (len(runs) == n and len(per_trial) == n and not missing and duplicates == 0
                   and Counter(r[1] for r in runs) == Counter({"FINISHED": n})),
        }


def start_backend(kind: str, root: Path):
    """(server, store, postgres cluster or None)."""
    postgres = None
    if kind == "postgresql":
        from test_postgres import PostgresCluster  # the tests' throwaway cluster

        pg_ctl = shutil.which("pg_ctl")
        if not pg_ctl:
            raise SystemExit("--backend postgresql: pg_ctl not found")
        postgres = PostgresCluster(Path(pg_ctl).resolve().parent)
    server = MLflowServer(root, backend=postgres.uri if postgres else None)
    return server, Store(None if postgres else server.db, postgres), postgres


# --------------------------------------------------------------------------- sampling


class Monitor(threading.Thread):
    """Every ``interval`` s: the driver's RSS, the MLflow writer's queue depth, the CPU time of
    every process of the tree (this one, its children: Ray, the server; PostgreSQL)."""

    def __init__(self, interval: float = 1.0):
        super().__init__(name="scale-monitor", daemon=True)
        self.interval = interval
        self.me = psutil.Process()
        self.t0 = time.monotonic()
        self.callbacks: list = []  # the MLflow callbacks run_sweep made (see capture_callbacks)
        self.server_pids: set[int] = set()
        self.extra_roots: dict[int, str] = {}  # pid -> category (PostgreSQL's postmaster)
        self.driver_pid: int | None = None  # --kill-at: the `haepo sweep` subprocess
        self.store: Store | None = None  # --kill-at: where finished trials are counted
        self.profile_writer = False
        self.writer_profile: cProfile.Profile | None = None
        self.finished = 0
        self.samples: list[dict] = []
        self.rss_marks: list[dict] = []
        self.cpu: dict[tuple[int, float], tuple[str, float]] = {}
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def queue_depth(self) -> int | None:
        if not self.callbacks:
            return None
        cb = self.callbacks[-1]
        return cb.backlog()

    def rss(self) -> int:
        pid = self.driver_pid
        try:
            return (psutil.Process(pid) if pid else self.me).memory_info().rss
        except psutil.Error:
            return 0

    def mark_rss(self, finished: int) -> None:
        self.rss_marks.append({"finished": finished, "t_s": round(time.monotonic() - self.t0, 2),
                               "rss_mb": round(self.rss() / 2**20, 1)})

    def _category(self, p: psutil.Process) -> str:
        if p.pid == self.me.pid:
            return "bench driver" if self.driver_pid else "driver"
        chain = [p.pid] + [q.pid for q in p.parents()]
        if any(pid in self.server_pids for pid in chain):
            return "mlflow server"
        for pid, name in self.extra_roots.items():
            if pid in chain:
                return name
        if self.driver_pid and p.pid == self.driver_pid:
            return "driver"
        cmd = p.cmdline()
        if cmd and (cmd[0].startswith("ray::") or any("default_worker.py" in c for c in cmd)):
            return "ray workers"
        if cmd and any("report" == c for c in cmd):
            return "haepo report"
        return "ray system"

    def sample_cpu(self) -> None:
        procs = [self.me] + self.me.children(recursive=True)
        for pid in self.extra_roots:
            try:
                root = psutil.Process(pid)
                procs += [root] + root.children(recursive=True)
            except psutil.Error:
                pass
        for p in procs:
            try:
                key = (p.pid, p.create_time())
                category = self.cpu[key][0] if key in self.cpu else None
                if category in (None, "ray system"):  # a worker's title is set after it starts
                    category = self._category(p)
                t = p.cpu_times()
                with self._lock:
                    self.cpu[key] = (category, t.user + t.system)
            except psutil.Error:
                continue

    def cpu_by_category(self) -> dict[str, float]:
        out: Counter = Counter()
        with self._lock:
            for category, seconds in self.cpu.values():
                out[category] += seconds
        return {k: round(v, 1) for k, v in sorted(out.items())}

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        self.sample_cpu()
        self.samples.append({"t_s": round(time.monotonic() - self.t0, 2), "finished": self.finished,
                             "queue": self.queue_depth(), "rss_mb": round(self.rss() / 2**20, 1)})

    def stop(self) -> None:
        self._halt.set()
        self.join(5)
        self.sample()


def capture_callbacks(monitor: Monitor) -> None:
    """Wraps run_sweep's make_callback so that the monitor holds the MLflow callback."""
    from haepo_ray.sweep import runner

    original = getattr(runner.make_callback, "__wrapped__", runner.make_callback)

    def make_callback(*args, **kwargs):
        cb = original(*args, **kwargs)
        monitor.callbacks.append(cb)
        writer = cb.writer
        if monitor.profile_writer:  # --profile: the MLflow writer's thread
            run = writer.run

            def profiled():
                monitor.writer_profile = cProfile.Profile()
                monitor.writer_profile.enable()
                try:
                    run()
                finally:
                    monitor.writer_profile.disable()

            writer.run = profiled
        return cb

    make_callback.__wrapped__ = original
    runner.make_callback = make_callback


def progress_callback(monitor: Monitor, n: int, on_finished=None):
    """A Tune callback counting finished trials (RSS every :data:`RSS_EVERY`)."""
    from ray import tune

    class Progress(tune.Callback):
        def on_trial_complete(self, iteration, trials, trial, **info):
            monitor.finished += 1
            if monitor.finished % RSS_EVERY == 0:
                monitor.mark_rss(monitor.finished)
            if on_finished is not None:
                on_finished(monitor.finished)

        def __reduce__(self):  # Tune pickles its callbacks (tuner.pkl): an inert copy
            return tune.Callback, ()

    return Progress()


# --------------------------------------------------------------------------- actors (--profile)


def actor_profile_hook():
    """Ray's worker_process_setup_hook with --profile: times Tune's reset of a reused actor,
    the trainable's reset_config, its algorithm's stop and build, each iteration; one JSON line
    per call in $HAEPO_SCALE_ACTOR_DIR/actor-<pid>.jsonl, and a cProfile of the actor's
    executing thread in actor-<pid>.prof (written every 10 s and at each reset)."""
    import cProfile as _cprofile
    import json as _json
    import os as _os
    import threading as _threading
    import time as _time

    folder = _os.environ.get("HAEPO_SCALE_ACTOR_DIR")
    if not folder:
        return
    from ray.tune.trainable import Trainable

    from haepo_ray.rl.algorithm import HAEPO
    from haepo_ray.sweep.kinds.rl.trainable import SweepTrainable

    pid = _os.getpid()
    log = open(f"{folder}/actor-{pid}.jsonl", "a", buffering=1)
    state = {"prof": None, "dumped": _time.monotonic(), "thread": None}

    def profile_here():
        if state["prof"] is None:
            state["prof"] = _cprofile.Profile()
            state["thread"] = _threading.get_ident()
            state["prof"].enable()

    def dump(force=False):
        prof = state["prof"]
        if prof is not None and (force or _time.monotonic() - state["dumped"] > 10) \
                and _threading.get_ident() == state["thread"]:
            prof.disable()
            prof.dump_stats(f"{folder}/actor-{pid}.prof")
            prof.enable()
            state["dumped"] = _time.monotonic()

    def timed(cls, name, label):
        original = getattr(cls, name)

        def wrapper(self, *args, **kwargs):
            profile_here()
            t, c = _time.perf_counter(), _time.thread_time()
            try:
                return original(self, *args, **kwargs)
            finally:
                log.write(_json.dumps({"m": label, "s": _time.perf_counter() - t,
                                       "cpu": _time.thread_time() - c}) + "\n")
                if label == "Trainable.reset":
                    dump()

        setattr(cls, name, wrapper)

    timed(Trainable, "reset", "Trainable.reset")
    timed(Trainable, "train", "Trainable.train")
    timed(Trainable, "stop", "Trainable.stop")
    timed(SweepTrainable, "reset_config", "reset_config")
    timed(SweepTrainable, "_build", "build")
    timed(SweepTrainable, "setup", "setup")
    timed(HAEPO, "stop", "algo.stop")
    import atexit

    atexit.register(lambda: dump(force=True))


def actor_summary(folder: Path) -> dict:
    calls: dict[str, list] = {}
    for path in folder.glob("actor-*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            calls.setdefault(row["m"], []).append(row)
    out = {}
    for name, rows in sorted(calls.items()):
        out[name] = {"calls": len(rows), "mean_s": round(statistics.mean(r["s"] for r in rows), 4),
                     "median_s": round(statistics.median(r["s"] for r in rows), 4),
                     "mean_cpu_s": round(statistics.mean(r["cpu"] for r in rows), 4)}
    profs = [str(p) for p in folder.glob("actor-*.prof")]
    if profs:
        stats = pstats.Stats(*profs, stream=io.StringIO())
        out["profile_top"] = top_functions(stats, 40)
        stats.dump_stats(str(folder / "actors.prof"))
    return out


def top_functions(stats: pstats.Stats, n: int) -> str:
    stream = io.StringIO()
    stats.stream = stream
    stats.sort_stats("cumulative").print_stats(n)
    return stream.getvalue()


# --------------------------------------------------------------------------- haepo report


def time_report(uri: str, root: Path, timeout_s: float) -> dict:
    """``haepo report --experiment`` as a subprocess: seconds and peak RSS."""
    cmd = [sys.executable, "-m", "haepo_ray.cli", "report", "--experiment", EXPERIMENT,
           "--tracking-uri", uri, "--out", str(root / "report")]
    timer = ["/usr/bin/time", "-v"] if os.path.exists("/usr/bin/time") else []
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    t = time.perf_counter()
    with open(root / "report.log", "w") as log:
        proc = subprocess.Popen(timer + cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, cwd=root)
        peak = 0
        while proc.poll() is None and time.perf_counter() - t < timeout_s:
            try:
                for p in [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True):
                    peak = max(peak, p.memory_info().rss)
            except psutil.Error:
                pass
            time.sleep(0.2)
        seconds = time.perf_counter() - t
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return {"finished": False, "note": f"did not finish in {timeout_s:.0f} s",
                    "peak_rss_mb": round(peak / 2**20)}
    text = (root / "report.log").read_text(errors="replace")
    for line in text.splitlines():
        if "Maximum resident set size" in line:
            peak = max(peak, int(line.rsplit(":", 1)[1]) * 1024)
    return {"finished": True, "returncode": proc.returncode, "seconds": round(seconds, 1),
            "peak_rss_mb": round(peak / 2**20), "tail": text[-600:] if proc.returncode else ""}


# --------------------------------------------------------------------------- in-process sweep


def sweep_in_process(args, root: Path, server: MLflowServer, store: Store, monitor: Monitor,
                     report: dict) -> dict:
    import ray

    from haepo_ray.envs import register_with_ray
    from haepo_ray.sweep.kinds import parse_plan
    from haepo_ray.sweep.runner import run_sweep

    n, slots = args.trials, args.slots
    ray_env: dict[str, Any] = {}
    actor_dir = root / "actors"
    if args.profile:
        actor_dir.mkdir()
        ray_env = {"worker_process_setup_hook": actor_profile_hook,
                   "env_vars": {"HAEPO_SCALE_ACTOR_DIR": str(actor_dir)}}
    t = time.perf_counter()
    ray.init(address="local", num_cpus=slots, include_dashboard=False, log_to_driver=False,
             runtime_env=ray_env or None)
    report["ray_init_s"] = round(time.perf_counter() - t, 2)
    register_with_ray()
    plan = parse_plan(spec_data(n, slots), "scale.yaml")
    monitor.profile_writer = args.profile
    capture_callbacks(monitor)
    outage: dict = {}

    def on_finished(done: int) -> None:
        if args.outage_s is not None and not outage and done >= args.outage_at * n:
            outage["at_finished"] = done
            threading.Thread(target=server_outage, args=(server, args.outage_s, outage, monitor),
                             daemon=True).start()

    timeline = Timeline()
    progress = progress_callback(monitor, n, on_finished)
    profiler = cProfile.Profile() if args.profile else None
    monitor.mark_rss(0)
    t0 = time.time()
    t = time.perf_counter()
    if profiler:
        profiler.enable()
    result = run_sweep(plan, tracking_uri=server.uri, storage_path=str(root / "results"),
                       out=io.StringIO(), verbose=0, extra_callbacks=[timeline, progress])
    if profiler:
        profiler.disable()
    wall = time.perf_counter() - t
    monitor.mark_rss(monitor.finished)
    monitor.sample()
    train = [float((r.metrics or {}).get("time_total_s", 0.0)) for r in result.result_grid]
    split = split_overhead(timeline.events, t0)
    split.update(concurrency(timeline.events, t0))
    out = {"wall_s": round(wall, 2), "trials_reported": len(result.trials),
           "statuses_in_tune": dict(Counter(t.status for t in result.trials)),
           "not_logged": len(result.not_logged), "sum_time_total_s": round(sum(train), 2),
           "timeline": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in split.items()}}
    if outage:
        while "restarted_s" not in outage and "error" not in outage:
            time.sleep(1)
        out["outage"] = outage
    if profiler:
        prof_dir = Path(args.out).with_suffix("")
        prof_dir.mkdir(parents=True, exist_ok=True)
        profiler.dump_stats(str(prof_dir / "driver.prof"))
        stats = pstats.Stats(profiler, stream=io.StringIO())
        (prof_dir / "driver_top.txt").write_text(top_functions(stats, 80))
        stats.sort_stats("tottime")
        stream = io.StringIO()
        stats.stream = stream
        stats.print_stats(60)
        (prof_dir / "driver_tottime.txt").write_text(stream.getvalue())
        out["profile_dir"] = str(prof_dir)
        if monitor.writer_profile is not None:
            monitor.writer_profile.dump_stats(str(prof_dir / "writer.prof"))
            stats = pstats.Stats(monitor.writer_profile, stream=io.StringIO())
            (prof_dir / "writer_top.txt").write_text(top_functions(stats, 60))
    ray.shutdown()
    if args.profile:
        time.sleep(2)  # the actors' atexit dumps
        actors = actor_summary(actor_dir)
        top = actors.pop("profile_top", "")
        if top:
            (Path(out["profile_dir"]) / "actors_top.txt").write_text(top)
            shutil.copy(actor_dir / "actors.prof", Path(out["profile_dir"]) / "actors.prof")
        out["actor_calls"] = actors
    return out


def concurrency(events: list, t0: float) -> dict:
    """From the timeline: trials running at once (mean over the sweep after the first start,
    and the most), the actors (pids) that ran trials, trials per actor."""
    running, most, area, last = 0, 0, 0.0, None
    pids: Counter = Counter()
    for ts, kind, _, info in sorted(events, key=lambda e: e[0]):
        if last is not None:
            area += running * (ts - last)
        last = ts
        if kind == "start":
            running += 1
            most = max(most, running)
        elif kind == "complete":
            running -= 1
        elif kind == "result" and info:
            pids[info[0]] += 1
    starts = [e[0] for e in events if e[1] == "start"]
    span = (last - min(starts)) if starts and last else 0.0
    return {"most_running": most, "mean_running": round(area / span, 2) if span else None,
            "trials_per_actor": sorted(pids.values(), reverse=True),
            "first_start_s": round(min(starts) - t0, 2) if starts else None,
            "sweep_after_first_start_s": round(span, 2)}


def server_outage(server: MLflowServer, seconds: float, record: dict, monitor: Monitor) -> None:
    """SIGKILLs the MLflow server (its process group), restarts it on the same port and store
    ``seconds`` later."""
    t = time.monotonic()
    record["killed_at_s"] = round(t - monitor.t0, 1)
    record["queue_at_kill"] = monitor.queue_depth()
    try:
        server.stop()
        time.sleep(seconds)
        server.start()
        monitor.server_pids.add(server.proc.pid)
        record["restarted_s"] = round(time.monotonic() - t, 1)  # down for (restart included)
        record["finished_when_back"] = monitor.finished
    except Exception as err:  # noqa: BLE001 - reported in the results
        record["error"] = repr(err)


# --------------------------------------------------------------------------- --kill-at


def driver_cmd(spec: Path, uri: str, root: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "haepo_ray.cli", "sweep", str(spec), "--tracking-uri", uri,
            "--storage-path", str(root / "results"), "--quiet", *extra]


def tune_finished(root: Path) -> int:
    """Trials whose one result Tune has written (``result.json`` not empty): finished trials,
    however far behind the MLflow writer is."""
    return sum(1 for f in root.glob("results/*/*/*/result.json") if f.stat().st_size > 0)


def run_driver(cmd: list[str], root: Path, log_name: str, monitor: Monitor, until=None,
               marks: tuple[int, ...] = (), by_tune: bool = False) -> dict:
    """Runs `haepo sweep` in its own process group; with ``until`` (a () -> bool), SIGKILLs
    the group (and the Ray processes it started) once it holds. Times at which ``marks``
    trials had finished: runs FINISHED in the store, or with ``by_tune`` trials Tune finished
    (``until`` and ``marks`` count the same)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    env["PYTHONUNBUFFERED"] = "1"
    t = time.perf_counter()
    reached: dict[int, float] = {}
    with open(root / log_name, "w") as log:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        monitor.driver_pid = proc.pid
        monitor.mark_rss(monitor.finished)
        killed = False
        last_rss_mark = 0
        while proc.poll() is None:
            time.sleep(0.25)
            # (by_tune: no SQL here; a query can wait seconds on the server's writes)
            done = monitor.finished = tune_finished(root) if by_tune else monitor.store.finished_children()
            for m in marks:
                if m not in reached and done >= m:
                    reached[m] = time.perf_counter() - t
            if done - last_rss_mark >= RSS_EVERY:
                last_rss_mark = done
                monitor.mark_rss(done)
            if until is not None and until(done):
                try:
                    tree = psutil.Process(proc.pid).children(recursive=True)
                except psutil.Error:
                    tree = []
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                for p in tree:  # Ray's processes that left the group
                    try:
                        p.kill()
                    except psutil.Error:
                        pass
                killed = True
                break
        wall = time.perf_counter() - t
    monitor.sample_cpu()
    monitor.driver_pid = None
    return {"wall_s": round(wall, 2), "returncode": proc.returncode, "killed": killed,
            "finished_in_store": monitor.store.finished_children(), "finished_in_tune": tune_finished(root),
            "reached_s": {str(k): round(v, 2) for k, v in reached.items()}}


def sweep_killed(args, root: Path, server: MLflowServer, store: Store, monitor: Monitor) -> dict:
    n, f = args.trials, args.kill_at
    spec = root / "scale.yaml"
    spec.write_text(yaml.safe_dump(spec_data(n, args.slots)))
    kill_at = max(1, int(f * n))
    monitor.store = store
    out: dict = {"kill_at_finished": kill_at}
    if args.reference:
        ref_root = root / "reference"
        ref_root.mkdir()
        ref_server, ref_store, ref_pg = start_backend(args.backend, ref_root)
        try:
            monitor.server_pids.add(ref_server.proc.pid)
            saved = monitor.store
            monitor.store = ref_store
            ref = run_driver(driver_cmd(spec, ref_server.uri, ref_root), ref_root, "reference.log",
                             monitor, marks=(kill_at,), by_tune=args.kill_by == "tune")
            monitor.store = saved
            ref["second_part_s"] = round(ref["wall_s"] - ref["reached_s"].get(str(kill_at), 0.0), 2)
            ref["store"] = ref_store.count(n)
            out["reference"] = ref
        finally:
            ref_server.kill()
            if ref_pg:
                ref_pg.stop()
    monitor.finished = 0
    first = run_driver(driver_cmd(spec, server.uri, root), root, "first.log", monitor,
                       until=lambda done: done >= kill_at, marks=(1, kill_at), by_tune=args.kill_by == "tune")
    out["first"] = first
    out["resumed"] = run_driver(driver_cmd(spec, server.uri, root, "--resume"), root, "resumed.log",
                                monitor, marks=(n,))
    # The first part's rate after its first finished trial (start-up left out).
    r = first["reached_s"]
    if "1" in r and str(kill_at) in r and kill_at > 1:
        rate = (kill_at - 1) / (r[str(kill_at)] - r["1"])
        out["second_part_at_first_part_rate_s"] = round((n - kill_at) / rate, 2)
    return out


# --------------------------------------------------------------------------- A/B


AB_KEYS = ("wall_s", "after_first_start_s", "driver_cpu_s", "total_cpu_s", "end_to_next_start_s",
           "s_per_trial_per_slot", "rss_kb_per_trial")


def ab(args) -> int:
    """The same sweep with the haepo_ray of each ``--ab`` folder, the folders taking turns,
    ``--repeats`` times; medians and ratios to the first folder."""
    runs: dict[str, list] = {c: [] for c in args.ab}
    for r in range(args.repeats):
        for code in args.ab:
            out = Path(tempfile.mkdtemp(prefix="haepo-scale-ab-")) / "run.json"
            env = {**os.environ, "PYTHONPATH": str(Path(code).resolve())}
            cmd = [sys.executable, str(Path(__file__).resolve()), "-n", str(args.trials), "--slots",
                   str(args.slots), "--no-report", "--out", str(out)]
            proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
            if not out.exists():
                raise SystemExit(proc.stdout[-2000:] + proc.stderr[-3000:])
            rep = json.loads(out.read_text())
            row = {"wall_s": rep["timing"]["wall_s"],
                   "after_first_start_s": rep["sweep"]["timeline"]["sweep_after_first_start_s"],
                   "driver_cpu_s": rep["cpu_s"].get("driver"), "total_cpu_s": rep["cpu_s"]["total"],
                   "end_to_next_start_s": rep["sweep"]["timeline"]["end_to_next_start_same_actor_s"],
                   "s_per_trial_per_slot": rep["timing"]["s_per_trial_per_slot"],
                   "store_ok": rep["store"]["ok"], "load": rep["load_before"],
                   "rss_kb_per_trial": rep["driver_rss"]["growth_kb_per_finished_trial"],
                   "actors": rep["sweep"]["timeline"].get("actors"),
                   "mean_running": rep["sweep"]["timeline"].get("mean_running"),
                   "cpu_s": rep["cpu_s"]}
            runs[code].append(row)
            shutil.rmtree(out.parent, ignore_errors=True)
            print(json.dumps({"repeat": r, "code": code, **row}), flush=True)
    base = {k: statistics.median(x[k] for x in runs[args.ab[0]]) for k in AB_KEYS}
    table = []
    for code in args.ab:
        med = {k: statistics.median(x[k] for x in runs[code]) for k in AB_KEYS}
        table.append({"code": code, **{k: round(v, 3) for k, v in med.items()},
                      **{f"{k}_ratio": round(med[k] / base[k], 3) for k in AB_KEYS if base[k]}})
        print(json.dumps(table[-1]), flush=True)
    out = Path(args.out or REPO / ".haepo" / "bench" / f"scale_ab_n{args.trials}_s{args.slots}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                               "trials": args.trials, "slots": args.slots, "runs": runs, "table": table},
                              indent=1))
    print(f"results: {out}")
    return 0


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", "-n", type=int, default=200)
    parser.add_argument("--slots", type=int, default=8, help="Ray's CPUs: trials at once (default 8)")
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--kill-at", type=float, help="fraction of finished trials at which the driver is killed")
    parser.add_argument("--reference", action="store_true", help="--kill-at: an uninterrupted run first")
    parser.add_argument("--kill-by", choices=["tune", "mlflow"], default="tune",
                        help="--kill-at counts the trials Tune finished (default) or the FINISHED runs in MLflow")
    parser.add_argument("--outage-s", type=float, help="seconds the MLflow server stays down")
    parser.add_argument("--outage-at", type=float, default=0.3, help="fraction of finished trials")
    parser.add_argument("--profile", action="store_true", help="cProfile the driver and the actors")
    parser.add_argument("--report-timeout", type=float, default=300.0)
    parser.add_argument("--no-report", action="store_true", help="do not time haepo report")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--out", help="JSON results (default .haepo/bench/scale_<mode>_n<N>_s<S>.json)")
    parser.add_argument("--ab", nargs="+", metavar="CODE",
                        help="A/B: checkouts whose haepo_ray runs the sweep in turn (the first is the base)")
    parser.add_argument("--repeats", type=int, default=3, help="--ab: runs per checkout")
    args = parser.parse_args(argv)
    if args.ab:
        return ab(args)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    n, slots = args.trials, args.slots
    mode = "kill" if args.kill_at is not None else "outage" if args.outage_s is not None else \
        "profile" if args.profile else "sweep"
    args.out = args.out or str(REPO / ".haepo" / "bench" / f"scale_{mode}_{args.backend}_n{n}_s{slots}.json")
    cores = psutil.cpu_count(logical=False) or os.cpu_count()
    report: dict[str, Any] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "mode": mode,
        "machine": f"{platform.node()} {os.cpu_count()} logical / {cores} physical cores, "
                   f"python {platform.python_version()}",
        "trials": n, "slots": slots, "physical_cores": cores, "backend": args.backend,
        "uptime_before": uptime(), "load_before": load(),
    }
    root = Path(tempfile.mkdtemp(prefix="haepo-scale-"))
    monitor = Monitor()
    postgres = None
    try:
        t = time.perf_counter()
        server, store, postgres = start_backend(args.backend, root)
        report["server_start_s"] = round(time.perf_counter() - t, 1)
        monitor.server_pids.add(server.proc.pid)
        if postgres is not None:
            pid = int((postgres.root / "data" / "postmaster.pid").read_text().split()[0])
            monitor.extra_roots[pid] = "postgresql"
        monitor.start()
        if args.kill_at is not None:
            report["kill"] = sweep_killed(args, root, server, store, monitor)
            wall = report["kill"]["first"]["wall_s"] + report["kill"]["resumed"]["wall_s"]
        else:
            report["sweep"] = sweep_in_process(args, root, server, store, monitor, report)
            wall = report["sweep"]["wall_s"]
        monitor.stop()
        report["uptime_after_sweep"] = uptime()
        report["load_after_sweep"] = load()
        report["store"] = store.count(n)
        sum_total = report.get("sweep", {}).get("sum_time_total_s") or report["store"]["sum_time_total_s_in_store"]
        minimum, cpu_minimum = sum_total / slots, sum_total / cores
        report["timing"] = {
            "wall_s": round(wall, 2),
            "sum_time_total_s": round(sum_total, 2),
            "minimum_s": round(minimum, 2), "cpu_bound_minimum_s": round(cpu_minimum, 2),
            "wall_over_minimum": round(wall / minimum, 2) if minimum else None,
            "wall_over_cpu_bound_minimum": round(wall / cpu_minimum, 2) if cpu_minimum else None,
            "s_per_trial_per_slot": round(wall * slots / n, 3),
            "s_per_trial_per_core": round(wall * cores / n, 3),
        }
        marks = monitor.rss_marks
        report["driver_rss"] = {
            "marks": marks,
            "growth_kb_per_finished_trial": round(
                (marks[-1]["rss_mb"] - marks[0]["rss_mb"]) * 1024 / max(1, marks[-1]["finished"] - marks[0]["finished"]),
                2) if len(marks) >= 2 else None,
            "peak_mb": max((s["rss_mb"] for s in monitor.samples), default=None),
        }
        queue = [s["queue"] for s in monitor.samples if s["queue"] is not None]
        report["mlflow_queue"] = {"max": max(queue, default=None),
                                  "mean": round(statistics.mean(queue), 1) if queue else None,
                                  "samples": [(s["t_s"], s["finished"], s["queue"]) for s in monitor.samples]}
        report["cpu_s"] = monitor.cpu_by_category()
        report["cpu_s"]["total"] = round(sum(report["cpu_s"].values()), 1)
        if not args.no_report:
            report["haepo_report"] = time_report(server.uri, root, args.report_timeout)
        report["uptime_after"] = uptime()
        server.kill()
    finally:
        if monitor.is_alive():
            monitor.stop()
        if postgres is not None:
            postgres.stop()
        if args.keep:
            report["work_dir"] = str(root)
        else:
            shutil.rmtree(root, ignore_errors=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    print(summary_line(report))
    print(f"results: {out}")
    return 0 if report["store"]["ok"] or mode == "outage" else 1


def summary_line(r: dict) -> str:
    t, s = r["timing"], r["store"]
    rep = r.get("haepo_report", {})
    rep_text = (f"report {rep['seconds']} s {rep['peak_rss_mb']} MB" if rep.get("finished")
                else f"report {rep.get('note', 'not run')}")
    return (f"scale {r['mode']} N={r['trials']} slots={r['slots']} cores={r['physical_cores']} {r['backend']}: "
            f"wall {t['wall_s']} s, minimum {t['minimum_s']} s (cpu-bound {t['cpu_bound_minimum_s']} s), "
            f"wall/min {t['wall_over_minimum']}, {t['s_per_trial_per_slot']} s/trial/slot, "
            f"{t['s_per_trial_per_core']} s/trial/core; driver RSS +{r['driver_rss']['growth_kb_per_finished_trial']} "
            f"KB/trial; CPU-s {r['cpu_s']}; queue max {r['mlflow_queue']['max']}; "
            f"runs {s['child_runs']}/{r['trials']}, missing rows {s['missing_rows']}, dup rows {s['duplicate_rows']}, "
            f"trials with >1 run {s['trials_with_more_than_one_run']}, statuses {s['statuses']}; {rep_text}; "
            f"{r['load_before']} -> {r['load_after_sweep']}")


if __name__ == "__main__":
    sys.exit(main())
