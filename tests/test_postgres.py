"""MLflow on a real PostgreSQL, the backend store of the cluster's MLflow server
(cluster/mlflow/, cluster/kubernetes/mlflow.yaml): Debian's PostgreSQL as a cluster of this
test's own (temporary folder, free port), ``mlflow server`` with two workers on it, and two
sweeps logging at once, one of them killed (its driver SIGKILLed) and resumed: every (run,
metric, step) exactly once, none missing, no deadlock. The figures it prints are in
BENCHMARKS.md. The killed and resumed sweep is test_sweep_e2e's killed driver (an RL sweep that
logs no training_iteration) with all its checks: that test, on SQLite, is its slow twin. In
`make test` each sweep has one trial; the slow tier runs two per sweep (four trials logging at
once; each trial's actor start costs seconds of CPU).

Needs Debian's PostgreSQL (``make postgres``): skipped without it, except in CI.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from drivers import kill_driver_when, resume_driver, start_driver, sweep_args
from helpers import ENV_STEPS, LOGGED, SMOKE, MLflowServer, free_port

ITERATIONS = {"pg-resumed": 10, "pg-steady": 20}  # the steady sweep goes on while the other resumes
EVERY_ITERATION = ("time_total_s", ENV_STEPS, "learners/default_policy/weight_entropy")


def postgres_bin() -> Path:
    """The newest ``/usr/lib/postgresql/<version>/bin`` (initdb and pg_ctl are not on PATH)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]))
    if not found:
        message = "MLflow's PostgreSQL test needs Debian's postgresql package"
        if os.environ.get("CI"):
            pytest.fail(message + " (run `make postgres`; .ci/run does)")
        pytest.skip(message)
    return found[-1].parent


class PostgresCluster:
    """A PostgreSQL cluster of its own in a temporary folder, listening on 127.0.0.1 at a free
    port, with the database ``mlflow``; run as the ``postgres`` user when this is root
    (PostgreSQL refuses root)."""

    def __init__(self, bin_dir: Path):
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="haepo-pg-"))  # not under pytest's 0700 folder
        self.port = free_port()
        # The form cluster/mlflow/start-mlflow.sh writes (the driver named: SQLAlchemy 2.1's
        # default for postgresql:// is psycopg 3).
        self.uri = f"postgresql+psycopg2://haepo@127.0.0.1:{self.port}/mlflow"
        self.user = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        if self.user:
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)
        self._run("initdb", "-D", str(self.root / "data"), "-U", "haepo", "--auth=trust", "-E", "UTF8",
                  "--locale=C")
        self._run("pg_ctl", "-D", str(self.root / "data"), "-l", str(self.log), "-w", "-t", "120", "start",
                  "-o", f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root}")
        self.sql("postgres", "create database mlflow")

    @property
    def log(self) -> Path:
        return self.root / "postgres.log"

    def _run(self, tool: str, *args: str) -> None:
        kwargs = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []} if self.user else {}
        subprocess.run([str(self.bin / tool), *args], check=True, capture_output=True, timeout=180,
                       cwd=self.root, **kwargs)

    def sql(self, database: str, query: str, *params):
        """The rows of ``query`` (autocommit)."""
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user="haepo", dbname=database)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(query, params)
                return cur.fetchall() if cur.description else []
        finally:
            conn.close()

    def logged_rows(self, experiment: str) -> Counter:
        """How often the store holds each (trial run, metric, step) of ``experiment``: every row
        of its metrics table (what drivers.logged_rows reads through MLflow's client, one
        request per run and metric: seconds here)."""
        return Counter({(run, key, step): n for run, key, step, n in self.sql(
            "mlflow", "select m.run_uuid, m.key, m.step, count(*) from metrics m "
                      "join runs r on r.run_uuid = m.run_uuid join experiments e on e.experiment_id = r.experiment_id "
                      "join tags t on t.run_uuid = m.run_uuid and t.key = 'haepo.role' and t.value = 'trial' "
                      "where e.name = %s group by m.run_uuid, m.key, m.step", experiment)})

    def metric_rows(self, experiment: str, key: str) -> int:
        return self.sql("mlflow", "select count(*) from metrics m join runs r on r.run_uuid = m.run_uuid "
                                  "join experiments e on e.experiment_id = r.experiment_id "
                                  "where e.name = %s and m.key = %s", experiment, key)[0][0]

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def postgres():
    cluster = PostgresCluster(postgres_bin())
    try:
        yield cluster
    finally:
        cluster.stop()


def _spec(tmp_path: Path, name: str, seeds: int) -> Path:
    data = yaml.safe_load(SMOKE.read_text())
    data.update(name=name, search_space={"seed": {"grid": list(range(seeds))}}, max_failures=0, checkpoint_frequency=2,
                stop={"iterations": ITERATIONS[name]}, resources={"cpus": 0.5}, max_concurrent_trials=2)
    data["settings"].update(lr=0.05, min_time_s_per_iteration=0.3)
    if name == "pg-resumed":  # its step key unlogged, as in test_sweep_e2e's killed driver
        data["tracking"] = {"metrics": LOGGED}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.slow  # a service and a killed driver: the fast tier's killed-driver resume is test_sweep_e2e's (SQLite)
@pytest.mark.parametrize("seeds", [2])
def test_two_sweeps_at_once_on_postgresql_one_killed_and_resumed(seeds, ray_session, postgres, tmp_path,
                                                                  monkeypatch, capfd):
    start = time.monotonic()
    server = MLflowServer(tmp_path, backend=postgres.uri, workers=2)
    try:
        address = ray_session.get_runtime_context().gcs_address
        results = tmp_path / "results"
        args = {name: sweep_args(_spec(tmp_path, name, seeds), server.uri, results, address) for name in ITERATIONS}
        with open(tmp_path / "steady.log", "w") as log:
            steady = start_driver(args["pg-steady"], tmp_path, log)
            try:
                kill_driver_when(args["pg-resumed"], tmp_path,
                                 lambda: postgres.metric_rows("pg-resumed", "time_total_s") >= 3)
                assert steady.poll() is None, "the steady sweep ended before the other was killed"
                monkeypatch.chdir(tmp_path)
                resume_driver(args["pg-resumed"], monkeypatch, capfd)
                assert steady.wait(300) == 0, (tmp_path / "steady.log").read_text()[-3000:]
            finally:
                if steady.poll() is None:
                    os.killpg(steady.pid, signal.SIGKILL)
        seconds = time.monotonic() - start

        client = MlflowClient(server.uri)
        rows = 0
        for name, iterations in ITERATIONS.items():
            (run_dir,) = list((results / name).iterdir())
            assert not (run_dir / "mlflow_not_logged.jsonl").exists(), (run_dir / "mlflow_not_logged.jsonl").read_text()
            trials = json.loads((run_dir / "haepo_summary.json").read_text())["trials"]
            assert [(t["status"], t["iterations"]) for t in trials] == [("TERMINATED", iterations)] * seeds, name
            exp = client.get_experiment_by_name(name)
            runs = client.search_runs([exp.experiment_id])
            # One parent (none made again by the resume), one child per trial.
            assert sorted(r.data.tags["haepo.role"] for r in runs) == ["sweep"] + ["trial"] * seeds, name
            assert all(r.info.status == "FINISHED" for r in runs), name
            children = [r for r in runs if r.data.tags["haepo.role"] == "trial"]
            # The (resumed) driver's summary names the runs, those made before the kill included.
            assert {t["trial_id"]: t["run_id"] for t in trials} == {
                c.data.tags["haepo.trial_id"]: c.info.run_id for c in children}, name
            logged = postgres.logged_rows(name)
            assert not {k: n for k, n in logged.items() if n > 1}, f"{name}: logged more than once"
            for run in children:
                for key in EVERY_ITERATION:
                    steps = sorted(s for (r, k, s) in logged if r == run.info.run_id and k == key)
                    assert steps == list(range(1, iterations + 1)), (name, key)
                if name == "pg-resumed":  # its step key unlogged
                    assert "training_iteration" not in run.data.metrics
                assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"checkpoint"}, name
            rows += sum(logged.values())
        ((deadlocks,),) = postgres.sql("mlflow", "select deadlocks from pg_stat_database where datname = 'mlflow'")
        log = postgres.log.read_text() + (tmp_path / "server.log").read_text()
        assert deadlocks == 0 and not re.search("deadlock", log, re.IGNORECASE), log[-3000:]
        print(f"PostgreSQL {postgres.bin.parts[-2]}: {rows} metric rows of {2 * seeds} trials in 2 sweeps at once "
              f"(one killed and resumed), {seconds:.0f} s with set-up, {deadlocks} deadlocks")
    finally:
        server.kill()
