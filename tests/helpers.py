"""Helpers that several test modules share (imported as ``helpers``: pytest puts tests/ on the path)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "tune_configs" / "smoke.yaml"
METRIC = "env_runners/episode_return_mean"
ENV_STEPS = "env_runners/num_env_steps_sampled_lifetime"
# The metrics the sweeps that are killed and resumed log (few: fewer rows to compare).
LOGGED = ["time_total_s", ENV_STEPS, METRIC, "learners/*"]

# Two prompts of three completions each: the groups of an LM update.
PROMPTS = ["the model writes", "the model writes", "the model writes",
           "we propose a method", "we propose a method", "we propose a method"]
COMPLETIONS = ["a short summary", "the paper", "results show the method improves accuracy",
               "for parsing", "a cat sat on the mat", "the method"]
RETURNS = {
    "HAEPO": torch.tensor([0.3, 0.9, 0.1, 0.5, 0.2, 0.7], dtype=torch.float64),
    "GRPO": torch.tensor([0.3, 0.9, 0.1, 0.5, 0.2, 0.7], dtype=torch.float64),
    "DPO": torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0], dtype=torch.float64),  # gold first, then samples
}


GRID_2D = "tests/Grid2D-v0"


class Grid2DEnv(gym.Env):
    """One step, observed as a 3 x 4 grid: a 2-D Box, which RLlib's default model cannot take."""

    observation_space = gym.spaces.Box(0.0, 1.0, (3, 4), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros((3, 4), np.float32), {}

    def step(self, action):
        return np.zeros((3, 4), np.float32), float(action), True, False, {}


if GRID_2D not in gym.registry:
    gym.register(GRID_2D, entry_point=Grid2DEnv)


def group_batch(tokenizer):
    """:data:`COMPLETIONS` after :data:`PROMPTS` as one update's batch of two groups of three."""
    from haepo_ray.llm.rollout import completion_batch

    batch = completion_batch(tokenizer, PROMPTS, COMPLETIONS)
    return type(batch)(batch.input_ids, batch.attention_mask, batch.completion_mask,
                       torch.tensor([0, 0, 0, 1, 1, 1]))


# --------------------------------------------------------------------------- MLflow

_EMPTY_STORE = None  # (a TemporaryDirectory, the empty store in it): made once per test process


def sqlite_store(path: Path) -> str:
    """The URI of the MLflow SQLite store at ``path``. Where there is none yet, an empty one is
    copied there first: the file MLflow made once in this process. Making a store runs MLflow's
    schema migrations, about 0.9 CPU-seconds each time (29 stores in `make test`). The tests
    that prove that a sweep or a server makes its own store (test_sweep_e2e's smoke sweep,
    test_tracking_uri, the multi-node cluster's server) leave it to them."""
    global _EMPTY_STORE
    if not path.exists():
        if _EMPTY_STORE is None:
            import tempfile

            from mlflow.tracking import MlflowClient

            folder = tempfile.TemporaryDirectory(prefix="haepo-empty-store-")
            empty = Path(folder.name) / "mlflow.db"
            MlflowClient(f"sqlite:///{empty}").search_experiments()
            _EMPTY_STORE = folder, empty
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_EMPTY_STORE[1], path)
    return f"sqlite:///{path}"


def llm_sweep(root: Path, experiment: str) -> tuple[str, object, str, str, dict]:
    """A new SQLite store at ``root`` with ``experiment`` and a language-model sweep's parent run
    of model ``tiny`` on ``aclsum``: (uri, client, experiment id, parent run id, the subject tags)."""
    from mlflow.tracking import MlflowClient

    from haepo_ray import names

    uri = sqlite_store(root / "mlflow.db")
    client = MlflowClient(uri)
    exp = client.create_experiment(experiment, artifact_location=(root / "artifacts").as_uri())
    subject = {names.MODEL: "tiny", names.DATA: "aclsum"}
    parent = client.create_run(exp, tags={names.ROLE: "sweep", **subject}).info.run_id
    return uri, client, exp, parent, subject


def llm_trial_run(client, experiment_id: str, parent: str, root: Path, *, algorithm: str, settings: dict,
                  seed: int, subject: dict, metrics: list, generations: str) -> str:
    """A language-model trial's run as a sweep writes it: tags (its method as ``{"algo": ..,
    setting: ..}`` where it has settings), ``metrics``, ``generations.jsonl`` at its root; finished."""
    from haepo_ray import names

    method = {"algo": algorithm, **settings} if settings else algorithm
    run_id = client.create_run(experiment_id, tags={
        names.PARENT_RUN: parent, names.ROLE: "trial", names.ALGORITHM: algorithm, names.SEED: str(seed),
        names.SEARCH_VALUES: json.dumps({"algorithm": method, "seed": seed}), **subject}).info.run_id
    client.log_batch(run_id, metrics=metrics)
    folder = root / "files" / run_id
    folder.mkdir(parents=True)
    (folder / "generations.jsonl").write_text(generations)
    client.log_artifact(run_id, str(folder / "generations.jsonl"))
    client.set_terminated(run_id)
    return run_id


def forbid_ray_start(monkeypatch) -> None:
    """A command that starts Ray fails the test (this process may have a Ray up already, which
    ``ray.is_initialized()`` would report)."""
    import pytest

    from haepo_ray import ray_start
    from haepo_ray.sweep import runner

    for module, starts in ((ray_start, "start_ray"), (runner, "init_ray")):
        monkeypatch.setattr(module, starts, lambda *a, **k: pytest.fail("Ray started"))


def fresh_python(code: str, timeout: float = 120) -> list[str]:
    """The lines ``code`` prints in a fresh interpreter (nothing imported first), once it
    exited 0 (else the test fails with the end of its stderr)."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.splitlines()


def sigint_as_in_a_terminal() -> None:
    """A ``preexec_fn``: SIGINT at its default in the child, as a terminal's foreground job has it.
    A test runner started with ``&`` or ``nohup`` passes it on ignored, and ``haepo train`` keeps
    an ignored SIGINT ignored, as such a job asks."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def bench_module(name: str):
    """``bench/<name>.py`` imported by its path (bench's scripts are not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_tree(args: list[str], *, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)``, except
    that a timeout kills every process under the child too (a sweep's driver in its own session,
    Ray, an ``mlflow server``), not the child alone, before it raises ``TimeoutExpired``: a test
    that runs out of time leaves nothing running beside the tests after it."""
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            try:
                out, err = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:  # a process outside the tree holds the pipes
                out = err = None
            raise subprocess.TimeoutExpired(args, timeout, out, err) from None
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MLflowServer:
    """A real ``mlflow server`` on 127.0.0.1, in its own process group, on the SQLite store
    ``root/server.db`` or on ``backend`` (a database URI), its routes under ``static_prefix``
    (``--static-prefix``; the URI ends with it); :meth:`stop` and :meth:`start` take it down
    and bring it back on its port and store (an outage)."""

    def __init__(self, root: Path, backend: str | None = None, workers: int = 1, static_prefix: str = ""):
        self.root = root
        self.backend = backend or sqlite_store(root / "server.db")
        self.workers = workers
        self.static_prefix = static_prefix
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}{static_prefix}"
        self.db = root / "server.db"
        self.log = open(root / "server.log", "w")
        self.start()

    def start(self) -> None:
        """Starts the server (on its port and store) and waits until it answers."""
        mlflow = Path(sys.executable).with_name("mlflow")
        self.proc = subprocess.Popen(
            [str(mlflow), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers",
             str(self.workers), "--backend-store-uri", self.backend,
             "--artifacts-destination", str(self.root / "artifacts"),
             *(["--static-prefix", self.static_prefix] if self.static_prefix else [])],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
            # No job execution: it starts a second process (huey consumer) that imports
            # MLflow alongside the server, tripling the start-up (20 s -> 60 s on 2 busy
            # cores); the tests use no MLflow jobs (cluster/local/start.sh turns it off too).
            env={**{k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"},
                 "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("mlflow server exited:\n" + (self.root / "server.log").read_text()[-2000:])
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        self.kill()
        raise RuntimeError("mlflow server did not answer /health in 90 s")

    def stop(self) -> None:
        """Kills the server (SIGKILL, its process group); :meth:`start` brings it back."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def kill(self) -> None:
        self.stop()
        self.log.close()


# Environment that must not leak from the developer's shell into the tests' clients.
CLIENT_ENV_DROP = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH",
                    "RAY_AUTH_MODE", "MLFLOW_TRACKING_URI", "HAEPO_STORAGE_PATH")


def client_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLIENT_ENV_DROP}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env.update(extra)
    return env


def write_spec(path: Path, name: str, *, iterations: int, extra_settings: dict | None = None,
               max_failures: int = 0, checkpoint_frequency: int = 2, lrs=(0.05, 0.1)) -> Path:
    """A small sweep: 2 seeds per lr (default 4 trials: 2 lr x 2 seeds) of HAEPO on the chain
    MDP, each asking for 1 CPU and half a gpu_slot (so only the workers can hold it)."""
    spec = {
        "name": name,
        "algorithm": "HAEPO",
        "env": "haepo/ChainMDP-v0",
        "env_config": {"length": 5, "horizon": 10},
        "settings": {
            "num_env_runners": 0,
            "batch_size": 8,
            "model_config": {"fcnet_hiddens": [16]},
            "custom_resources_for_main_process": {"gpu_slot": 0.5},
            **(extra_settings or {}),
        },
        "search_space": {"lr": {"grid": list(lrs)}, "seed": {"grid": [0, 1]}},
        "metric": "env_runners/episode_return_mean",
        "mode": "max",
        "stop": {"iterations": iterations},
        "resources": {"cpus": 1, "gpus": 0},
        "max_concurrent_trials": 2,
        # A fresh actor per trial: with reuse, a trial that ends before the other worker's
        # actor has started (imports take seconds on a loaded CI machine) hands its actor to
        # the next trial, and the whole sweep can run on one worker (seen in CI).
        "reuse_actors": False,
        "max_failures": max_failures,
        "checkpoint_frequency": checkpoint_frequency,
        "checkpoint_at_end": True,
        "tracking": {"log_checkpoints": False},
    }
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run_jobs_main(argv: list[str], capsys) -> tuple[int, str, str]:
    """``haepo ARGV`` in this process: (exit code, stdout, stderr)."""
    from haepo_ray import cli

    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def kill_tree(pid: int) -> None:
    """SIGKILLs process ``pid`` and every process under it (those that are still there)."""
    import psutil

    try:
        tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        tree = []
    for p in tree:
        try:
            p.kill()
        except psutil.Error:
            pass
