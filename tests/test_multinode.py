"""Multi-node operation on one machine: `haepo submit` to a real 3-node Ray cluster.

The cluster is cluster/local/start.sh: a head (0 CPUs) and two workers (1 CPU and one
``gpu_slot`` each, standing in for a GPU), each its own ``ray start --block`` in its own
session, on the loopback addresses 127.0.0.1 / 127.0.0.2 / 127.0.0.3 (so a trial's
``node_ip`` names its node), Ray token authentication on with a token of its own
(``<state dir>/auth_token``; ~/.ray is never touched), and a real ``mlflow server`` (SQLite).
Every process is started by the scripts and stopped by cluster/local/stop.sh by its pid
(session); the fixture then checks that no process mentioning the state directory is left,
and SIGKILLs any by pid.

``haepo submit``'s checks that need no cluster are tests/test_jobs.py's. The whole module is
the slow tier's (a cluster of its own and a killed node: 72 CPU-s of the 2-core machine).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import CLIENT_ENV_DROP, client_env, run_jobs_main, write_spec

REPO = Path(__file__).resolve().parents[1]
LOCAL = REPO / "cluster" / "local"
WORKER_IPS = {"worker-1": "127.0.0.2", "worker-2": "127.0.0.3"}
pytestmark = pytest.mark.slow


# --------------------------------------------------------------------------- helpers


def haepo_cmd(*args: str) -> list[str]:
    """The `haepo` command line, run with this interpreter."""
    return [sys.executable, "-m", "haepo_ray.cli", *args]


# --------------------------------------------------------------------------- the cluster


@dataclass
class LocalCluster:
    dir: Path
    dashboard: str
    mlflow: str
    storage: str
    token_file: Path
    nodes: dict  # name -> {"pid": int, "ip": str}
    start_seconds: float

    def env(self, **extra: str) -> dict[str, str]:
        return client_env(RAY_AUTH_TOKEN_PATH=str(self.token_file), **extra)

    def sdk(self):
        from ray.job_submission import JobSubmissionClient

        token = self.token_file.read_text().strip()
        return JobSubmissionClient(self.dashboard, headers={"Authorization": f"Bearer {token}"})


def _pids_mentioning(text: str) -> list[int]:
    """Live processes whose command line mentions ``text`` (our unique state directory)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            pids.append(int(entry.name))
    return pids


@pytest.fixture(scope="module")
def cluster():
    if shutil.which("setsid") is None or not Path("/proc").is_dir():
        pytest.skip("needs Linux with setsid (util-linux)")
    state = Path(tempfile.mkdtemp(prefix="hr-", dir="/tmp"))  # short: Ray's socket paths
    env = client_env(
        # Notice a lost node in ~3 s (Ray's default: 3 s x 5 checks).
        RAY_health_check_period_ms="1000",
        RAY_health_check_timeout_ms="1000",
        RAY_health_check_failure_threshold="3",
    )
    start = time.monotonic()
    out = subprocess.run([str(LOCAL / "start.sh"), "-d", str(state)], env=env,
                         capture_output=True, text=True, timeout=400)
    seconds = time.monotonic() - start
    try:
        if out.returncode != 0:
            pytest.fail(f"cluster/local/start.sh failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
        info = json.loads((state / "cluster.json").read_text())
        yield LocalCluster(Path(info["dir"]), info["dashboard"], info["mlflow"], info["storage_path"],
                           Path(info["token_file"]), info["nodes"], seconds)
    finally:
        stop = subprocess.run([str(LOCAL / "stop.sh"), "-d", str(state)], capture_output=True,
                              text=True, timeout=180)
        print(stop.stdout, stop.stderr)
        # Job drivers run in sessions of their own; Ray's supervisor watcher kills them when
        # the head goes. Whatever still mentions our state directory after that is a leak.
        deadline = time.monotonic() + 20
        while _pids_mentioning(str(state)) and time.monotonic() < deadline:
            time.sleep(0.5)
        leftover = _pids_mentioning(str(state))
        for pid in leftover:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(state, ignore_errors=True)
        assert not leftover, f"processes left after stop.sh (now SIGKILLed): {leftover}"


def _sweep_runs(uri: str, experiment: str):
    from haepo_ray.tracking import find_sweep_runs

    return find_sweep_runs(uri, experiment)


def _node_ids_by_ip(c: LocalCluster) -> dict[str, str]:
    sys.path.insert(0, str(LOCAL))
    try:
        import lib as local_lib  # cluster/local/lib.py
    finally:
        sys.path.remove(str(LOCAL))
    return {n["node_ip"]: n["node_id"] for n in local_lib.alive_nodes(c.dashboard, str(c.token_file))}


# Slow tier: the node-loss test below submits a sweep the same way (without --follow), with a
# trial on each worker, and checks the job, its listing and MLflow.
@pytest.mark.timeout(600)
def test_submit_runs_a_sweep_on_both_workers(cluster, tmp_path):
    """`haepo submit --follow` runs a 2-trial sweep as a Ray Job; the trials land on both
    workers (never on the CPU-0 head); MLflow on the real server holds one parent and exactly
    one FINISHED child per trial, tagged with its node. Two trials suffice: both start at
    once and each worker has room for one; every further trial is ~6 s more on 2 cores.
    The submitting shell's HAEPO_PATCHES reaches the trials' actors on the workers (their runs'
    provenance tags it)."""
    spec = write_spec(tmp_path / "multi.yaml", "multinode", iterations=6, lrs=(0.05,))
    start = time.monotonic()
    out = subprocess.run(
        haepo_cmd("submit", str(spec), "--address", cluster.dashboard, "--follow",
                  "--tracking-uri", cluster.mlflow, "--storage-path", cluster.storage),
        env=cluster.env(HAEPO_PATCHES="required"), capture_output=True, text=True, timeout=500)
    seconds = time.monotonic() - start
    print(f"haepo submit --follow: {seconds:.1f} s (cluster start {cluster.start_seconds:.1f} s)")
    assert out.returncode == 0, f"{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    job_id = out.stdout.splitlines()[0].strip()
    assert re.fullmatch(r"haepo-multinode-\d{8}-\d{6}-[0-9a-f]{4}", job_id), job_id
    assert "SUCCEEDED" in out.stderr

    parent, children = _sweep_runs(cluster.mlflow, "multinode")
    assert parent.info.status == "FINISHED"
    trial_ids = [c.data.tags["haepo.trial_id"] for c in children]
    assert len(children) == 2 and len(set(trial_ids)) == 2, trial_ids
    assert {c.info.status for c in children} == {"FINISHED"}
    ips = {c.data.tags["haepo.node_ip"] for c in children}
    assert ips == set(WORKER_IPS.values()), f"trials ran on {ips}, expected both workers"
    node_ids = _node_ids_by_ip(cluster)
    tagged = {c.data.tags.get("haepo.node_id") for c in children} - {None}
    if tagged:  # the tracking callback records Ray node ids too
        assert tagged == {node_ids[ip] for ip in WORKER_IPS.values()}
    for c in children:
        assert int(c.data.metrics["training_iteration"]) == 6
    assert {r.data.tags.get("haepo.code.patches") for r in [parent, *children]} == {"required"}

    listing = subprocess.run(haepo_cmd("jobs", "--address", cluster.dashboard), env=cluster.env(),
                             capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0, listing.stderr
    (row,) = [line for line in listing.stdout.splitlines() if line.startswith(job_id)]
    assert "SUCCEEDED" in row and "multinode" in row


@pytest.mark.timeout(300)
def test_wrong_or_missing_token_is_refused(cluster, tmp_path):
    spec = write_spec(tmp_path / "tok.yaml", "wrong-token", iterations=1)
    before = {j.submission_id for j in cluster.sdk().list_jobs()}

    wrong = tmp_path / "wrong_token"
    wrong.write_text("0" * 64)
    out = subprocess.run(
        haepo_cmd("submit", str(spec), "--no-check", "--address", cluster.dashboard,
                  "--auth-token-file", str(wrong)),
        env=cluster.env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "haepo submit: error: the Ray cluster at" in out.stderr
    assert "refused the authentication token from --auth-token-file" in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""

    # No token anywhere (no env, a HOME without ~/.ray/auth_token): told what to set.
    home = tmp_path / "home"
    home.mkdir()
    env = client_env(HOME=str(home))
    out = subprocess.run(haepo_cmd("jobs", "--address", cluster.dashboard), env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "requires an authentication token and none was sent" in out.stderr
    assert "Traceback" not in out.stderr

    assert {j.submission_id for j in cluster.sdk().list_jobs()} == before, "nothing was submitted"


def _child_progress(uri: str, experiment: str) -> list[tuple[str, str, int]]:
    try:
        _, children = _sweep_runs(uri, experiment)
    except LookupError:
        return []
    return [(c.data.tags.get("haepo.trial_id", ""), c.data.tags.get("haepo.node_ip", ""),
             int(c.data.metrics.get("training_iteration", 0))) for c in children]


def _iterations_logged(storage: str, experiment: str, trial_id: str) -> list[int]:
    """training_iteration of every result Tune wrote for the trial (result.json, in order)."""
    (trial_dir,) = Path(storage, experiment).glob(f"*/*_{trial_id}_*")
    rows = [json.loads(line) for line in (trial_dir / "result.json").read_text().splitlines() if line.strip()]
    return [int(r["training_iteration"]) for r in rows]


@pytest.mark.timeout(900)
def test_haepo_stop_ends_a_sweep_as_ctrl_c_and_a_resumed_submission_finishes_it(cluster, tmp_path):
    """`haepo stop` (Ray's SIGTERM to the driver alone): Tune saves the sweep, the job ends
    STOPPED, the running trials' runs and the parent KILLED; `haepo submit --resume` finishes
    it from the trials' checkpoints, each (run, metric, step) once. Two trials, one per worker."""
    spec = write_spec(tmp_path / "stop.yaml", "stop-resume", iterations=20, lrs=(0.05,),
                      extra_settings={"min_time_s_per_iteration": 0.5})
    submit = haepo_cmd("submit", str(spec), "--address", cluster.dashboard, "--tracking-uri", cluster.mlflow,
                       "--storage-path", cluster.storage)
    out = subprocess.run(submit, env=cluster.env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.splitlines()[0].strip()
    sdk = cluster.sdk()
    deadline = time.monotonic() + 300
    while not [1 for _, _, it in _child_progress(cluster.mlflow, "stop-resume") if it >= 4]:
        status = sdk.get_job_status(job_id).value
        assert status in ("PENDING", "RUNNING") and time.monotonic() < deadline, \
            f"job {status}, no trial past 4 iterations:\n{sdk.get_job_logs(job_id)[-4000:]}"
        time.sleep(0.5)
    start = time.monotonic()
    stop = subprocess.run(haepo_cmd("stop", job_id, "--address", cluster.dashboard), env=cluster.env(),
                          capture_output=True, text=True, timeout=120)
    print(f"haepo stop: {time.monotonic() - start:.1f} s")
    assert stop.returncode == 0 and f"job {job_id} STOPPED" in stop.stdout, stop.stdout + stop.stderr
    logs = sdk.get_job_logs(job_id)
    assert "sweep interrupted (SIGTERM): " in logs and "without them" not in logs, logs[-4000:]
    parent, children = _sweep_runs(cluster.mlflow, "stop-resume")
    assert parent.info.status == "KILLED"
    assert "KILLED" in {c.info.status for c in children} and "RUNNING" not in {c.info.status for c in children}

    out = subprocess.run(submit + ["--resume", "--follow"], env=cluster.env(), capture_output=True, text=True,
                         timeout=500)
    assert out.returncode == 0, f"{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    parent, children = _sweep_runs(cluster.mlflow, "stop-resume")
    assert parent.info.status == "FINISHED" and [c.info.status for c in children] == ["FINISHED"] * 2
    from mlflow.tracking import MlflowClient

    for child in children:
        history = MlflowClient(cluster.mlflow).get_metric_history(child.info.run_id, "training_iteration")
        assert sorted(m.step for m in history) == list(range(1, 21)), "every step logged once"


@pytest.mark.timeout(900)
def test_sweep_survives_the_loss_of_a_worker_node(cluster, tmp_path, capsys, monkeypatch):
    """A worker node is SIGKILLed (its whole session, by pid) while it runs a trial that has
    checkpoints; the sweep finishes, the lost trial is retried from its last checkpoint on the
    surviving worker, and MLflow holds no duplicate and no orphaned RUNNING run.

    Two trials, one per worker: the victim on worker-2, and the one on worker-1 that the
    victim's retry waits for (the survivor has one CPU). More trials only queue behind them on
    the survivor (each ~8 s more and a new actor). 16 iterations of at least 0.5 s: the kill
    lands between the victim's 4th and 12th (a checkpoint every 2), so that at least 4 are left
    to run from its checkpoint on the survivor."""
    alive = _node_ids_by_ip(cluster)
    if not set(WORKER_IPS.values()) <= set(alive):
        pytest.fail(f"both workers must be alive at the start, alive: {sorted(alive)}")
    spec = write_spec(tmp_path / "fail.yaml", "node-failure", iterations=16, max_failures=3,
                      extra_settings={"min_time_s_per_iteration": 0.5}, lrs=(0.05,))
    start = time.monotonic()
    out = subprocess.run(
        haepo_cmd("submit", str(spec), "--address", cluster.dashboard,
                  "--tracking-uri", cluster.mlflow, "--storage-path", cluster.storage),
        env=cluster.env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.splitlines()[0].strip()
    assert re.fullmatch(r"haepo-node-failure-\d{8}-\d{6}-[0-9a-f]{4}", job_id), job_id
    sdk = cluster.sdk()

    # Wait until a trial on worker-2 is past its first checkpoint (every 2 iterations).
    victim_ip = WORKER_IPS["worker-2"]
    deadline = time.monotonic() + 300
    victims: list[tuple[str, int]] = []
    while time.monotonic() < deadline and not victims:
        status = sdk.get_job_status(job_id).value
        assert status in ("PENDING", "RUNNING"), f"job {status} before the kill:\n{sdk.get_job_logs(job_id)[-4000:]}"
        victims = [(t, it) for t, ip, it in _child_progress(cluster.mlflow, "node-failure")
                   if ip == victim_ip and 4 <= it < 12]
        time.sleep(0.5)
    assert victims, "no trial ran on worker-2"
    kill = subprocess.run([str(LOCAL / "kill-node.sh"), "-d", str(cluster.dir), "worker-2"],
                          capture_output=True, text=True, timeout=30)
    assert kill.returncode == 0, kill.stderr
    killed_at = time.monotonic() - start
    print(f"killed worker-2 at {killed_at:.1f} s (trials there: {victims}): {kill.stdout.strip()}")

    deadline = time.monotonic() + 600
    while sdk.get_job_status(job_id).value not in ("SUCCEEDED", "FAILED", "STOPPED"):
        assert time.monotonic() < deadline, "the sweep did not finish after the node loss"
        time.sleep(1.0)
    seconds = time.monotonic() - start
    logs = sdk.get_job_logs(job_id)
    print(f"node-failure sweep: {seconds:.1f} s")
    assert sdk.get_job_status(job_id).value == "SUCCEEDED", logs[-6000:]
    # Exactly the killed node is gone (Ray advertises the head under the machine's address).
    assert _node_ids_by_ip(cluster).keys() == alive.keys() - {victim_ip}
    # `haepo jobs` lists it (run in this process; the submit test runs it as a command).
    for key in CLIENT_ENV_DROP:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(cluster.token_file))
    code, listing, err = run_jobs_main(["jobs", "--address", cluster.dashboard], capsys)
    assert code == 0, err
    (row,) = [line for line in listing.splitlines() if line.startswith(job_id)]
    assert "SUCCEEDED" in row and "node-failure" in row

    parent, children = _sweep_runs(cluster.mlflow, "node-failure")
    assert parent.info.status == "FINISHED"
    by_trial = {}
    for c in children:
        by_trial.setdefault(c.data.tags["haepo.trial_id"], []).append(c)
    assert len(children) == 2 and all(len(v) == 1 for v in by_trial.values()), \
        {t: [c.info.run_id for c in v] for t, v in by_trial.items()}
    assert {c.info.status for c in children} == {"FINISHED"}, "no orphaned RUNNING runs"
    from mlflow.tracking import MlflowClient

    exp = MlflowClient(cluster.mlflow).get_experiment_by_name("node-failure")
    running = MlflowClient(cluster.mlflow).search_runs([exp.experiment_id], "attributes.status = 'RUNNING'")
    assert not running, [r.info.run_id for r in running]

    for trial_id, at_kill in victims:
        (run,) = by_trial[trial_id]
        assert int(run.data.tags["haepo.num_failures"]) >= 1, run.data.tags
        assert run.data.tags["haepo.node_ip"] == WORKER_IPS["worker-1"], "resumed on the survivor"
        assert int(run.data.metrics["training_iteration"]) == 16
        # Tune's own record: after the failure the trial went on from a checkpoint, not from
        # scratch (iteration 1 only once), and reached the end. A node killed right after a
        # checkpoint leaves nothing to replay, so a repeated iteration is possible, not required.
        iterations = _iterations_logged(cluster.storage, "node-failure", trial_id)
        restarts = [b for a, b in zip(iterations, iterations[1:]) if b <= a]
        assert iterations.count(1) == 1 and all(b > 1 for b in restarts), iterations
        assert iterations[-1] == 16
        history = MlflowClient(cluster.mlflow).get_metric_history(run.info.run_id, "training_iteration")
        steps = sorted(m.step for m in history)
        assert steps == list(range(1, 17)), "every step logged once"
