"""The `haepo` command: in this process (help, versions, environments, usage errors, training
without tracking), and training as a real subprocess."""

from __future__ import annotations

import fnmatch
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import GRID_2D, SMOKE, forbid_ray_start, free_port, kill_tree, sigint_as_in_a_terminal, sqlite_store

from haepo_ray.cli import main
from haepo_ray import names
from haepo_ray.terminated import Terminated
from haepo_ray.cli.signals import STOP_SIGNALS, StopRequest
from haepo_ray.envs import registered_envs


def haepo(*args: str, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "haepo_ray.cli", *args],
        capture_output=True, text=True, timeout=timeout, **kwargs,
    )


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["--help"])
    assert stopped.value.code == 0
    out = capsys.readouterr().out
    for command in ("version", "envs", "train", "sweep", "submit", "jobs", "logs", "stop"):
        assert command in out


def test_version(capsys):
    assert main(["version"]) == 0
    assert capsys.readouterr().out.startswith("haepo-ray 0.1.0 (ray 2.60")


def test_envs_lists_every_registered_id(capsys):
    assert main(["envs"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == list(registered_envs())


@pytest.mark.parametrize(
    "args, message",
    [
        (["--env", "Nope-v0"], "unknown env 'Nope-v0'"),
        (["--env", "haepo/ChainMDP-v0", "--algo", "NOPE"], "unknown algorithm 'NOPE'"),
        (["--env", "haepo/ChainMDP-v0", "--set", "not_a_setting=1"], "HAEPOConfig has no setting 'not_a_setting'"),
        (["--env", "haepo/ChainMDP-v0", "--set", "beta_entt=0.1", "--set", "lrr=0.1"],
         "HAEPOConfig has no setting 'beta_entt' (did you mean beta_ent, beta_kl?), 'lrr' (did you mean lr?)"),
        (["--env", "haepo/ChainMDP-v0", "--set", "beta_ent=-1"], "beta_ent must be a finite number >= 0"),
        (["--env", "haepo/ChainMDP-v0", "--set", "lr"], "--set expects key=value"),
        (["--env", "haepo/ChainMDP-v0", "--set", "lr=0.1", "--set", "lr=0.2"],
         "--set lr is given twice (0.1, then '0.2'): give it once"),
        (["--env", "haepo/ChainMDP-v0", "--set", "model_config={fcnet_hiddens: [8], fcnet_hiddens: [4]}"],
         "--set model_config: not valid YAML: found key 'fcnet_hiddens' again (first on line 1)"),
        (["--env", "haepo/ChainMDP-v0", "--set", "env_config={length: 0}"],
         "env_config: haepo/ChainMDP-v0 does not take {'length': 0}: ValueError: ChainMDPEnv: length must be an "
         "integer >= 1, got 0"),
        (["--env", "haepo/ChainMDP-v0", "--set", "env_config={lenght: 3}"],
         "env_config: haepo/ChainMDP-v0 does not take {'lenght': 3}: TypeError: "),
        (["--env", GRID_2D], f"HAEPO's model for {GRID_2D} cannot be built: observations Box(0.0, 1.0, (3, 4), "
         "float32), actions Discrete(2): ValueError: No default encoder config"),
        (["--env", "haepo/ChainMDP-v0", "--set", "model_config={fcnet_hiddens: [a]}"],
         "HAEPO's model for haepo/ChainMDP-v0 cannot be built: observations Box(0.0, 1.0, (6,), float32), "
         "actions Discrete(2): ValueError: "),
        (["--env", "haepo/ChainMDP-v0", "--set", "reference_policy=initial", "--set", "reference_update_interval=5"],
         "--set reference_update_interval: this run would not read it: it is how often the 'lagged' reference policy "
         "is refreshed (here: reference_policy 'initial'); leave it out"),
        (["--env", "haepo/ChainMDP-v0", "--algo", "DPO", "--set", "reward_normalization=sum"],
         "--set reward_normalization: this run would not read it: DPO's loss reads only the order of the returns"),
        (["--env", "haepo/ChainMDP-v0", "--stop-iters", "0"], "--stop-iters 0: Input should be greater than or equal to 1"),
        (["--env", "haepo/ChainMDP-v0", "--stop-time", "-1"], "--stop-time -1.0: Input should be greater than 0"),
        (["--env", "haepo/ChainMDP-v0", "--stop-return", "nan"], "--stop-return nan: Input should be a finite number"),
        (["--stop-iters", "3"], "give --env (or --restore a checkpoint)"),
        (["--restore", "no/such/folder"], "--restore no/such/folder: no such folder"),
    ],
)
def test_train_rejects_bad_input_before_starting_ray(args, message, capsys, monkeypatch):
    """In this process (each subprocess would import RLlib again): exit status 2 and the
    message, not an exception, and Ray is never started."""
    import ray

    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started"))
    assert main(["train", *args]) == 2
    assert message in capsys.readouterr().err



def test_an_empty_experiment_name_is_a_usage_error(capsys, monkeypatch, tmp_path):
    """haepo train logged to its default experiment, 'train', without a word."""
    forbid_ray_start(monkeypatch)
    monkeypatch.chdir(tmp_path)
    for command in (["train", "--env", "haepo/ChainMDP-v0"], ["report"]):
        with pytest.raises(SystemExit) as exit_:
            main([*command, "--experiment", " "])
        assert exit_.value.code == 2
        assert "argument --experiment: ' ' is empty: give a name, or leave --experiment out" in capsys.readouterr().err

def test_set_values_are_yaml_as_a_spec_reads_it():
    """``1e-3`` is a float, as in a spec (plain YAML 1.1 reads the string '1e-3')."""
    from haepo_ray.cli.errors import UsageError
    from haepo_ray.cli.train import parse_overrides

    assert parse_overrides(["lr=1e-3", "model_config={fcnet_hiddens: [8]}", "gamma = 0.9"]) == {
        "lr": 0.001, "model_config": {"fcnet_hiddens": [8]}, "gamma": 0.9}
    with pytest.raises(UsageError, match=r"^--set seed=3: give --seed 3$"):  # the tag would say --seed's
        parse_overrides(["seed=3"])


def test_train_stop_options_make_a_stop_spec():
    from haepo_ray.cli import make_parser
    from haepo_ray.cli.train import stop_spec
    from haepo_ray.sweep.spec import StopSpec

    def stop(*args: str) -> StopSpec:
        return stop_spec(make_parser().parse_args(["train", "--env", "haepo/ChainMDP-v0", *args]))

    assert stop() == StopSpec(iterations=100)
    assert stop("--stop-time", "60", "--stop-env-steps", "5000", "--stop-return", "0.9") == StopSpec(
        seconds=60, env_steps=5000, episode_return_mean=0.9)


def test_train_runs_logs_to_mlflow_and_writes_a_loadable_checkpoint(tmp_path):
    ckpt, uri = tmp_path / "ckpt", sqlite_store(tmp_path / "mlflow.db")
    out = haepo(
        "train", "--env", "haepo/ChainMDP-v0", "--stop-iters", "3", "--seed", "1",
        "--num-cpus", "2", "--set", "lr=0.05", "--set", "model_config={fcnet_hiddens: [8]}",
        "--set", "evaluation_interval=2", "--set", "evaluation_duration=2",
        "--checkpoint-dir", str(ckpt), "--tracking-uri", uri, "--experiment", "chain",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    progress = [line for line in out.stdout.splitlines() if line.startswith("iter")]
    assert [int(line.split()[1]) for line in progress] == [1, 2, 3]
    assert "H(w)" in progress[0] and "KL" in progress[0]
    assert ["evaluation return" in line for line in progress] == [False, True, False]  # where RLlib evaluated
    assert f"checkpoint: {ckpt}" in out.stdout
    assert "RLModule(config=" not in out.stderr  # RLlib's deprecation notice of its own call

    from ray.rllib.core.rl_module.rl_module import RLModule

    module = RLModule.from_checkpoint(ckpt / "learner_group" / "learner" / "rl_module" / "default_policy")
    assert sum(p.numel() for p in module.parameters()) > 0

    from mlflow.tracking import MlflowClient

    from haepo_ray import names
    from haepo_ray.tracking import DEFAULT_METRICS, TRAIN_ROLE

    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("chain").experiment_id])
    assert f"MLflow run: {run.info.run_id}" in out.stdout
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert {k: tags[k] for k in (names.ROLE, names.ALGORITHM, names.ENV, names.SEED, names.CHECKPOINT)} == {
        names.ROLE: TRAIN_ROLE, names.ALGORITHM: "HAEPO", names.ENV: "haepo/ChainMDP-v0", names.SEED: "1",
        names.CHECKPOINT: str(ckpt)}
    assert {names.CODE_COMMIT, names.MACHINE_CPUS, names.VERSION_RAY, names.NODE_IP} <= set(tags)
    params = run.data.params
    assert (params["lr"], params["_model_config/fcnet_hiddens"], params["stop/training_iteration"]) == ("0.05", "[8]", "3")
    assert "checkpoint/rllib_checkpoint.json" in {a.path for a in client.list_artifacts(run.info.run_id, "checkpoint")}
    keys = set(run.data.metrics)
    assert {names.TRAINING_ITERATION, names.EPISODE_RETURN_MEAN, names.WEIGHT_ENTROPY,
            names.EVAL_EPISODE_RETURN_MEAN} <= keys
    assert all(any(fnmatch.fnmatchcase(k, p) for p in DEFAULT_METRICS) for k in keys)  # the sweep's selection
    for key in keys:  # RLlib evaluated in iteration 2 alone (its later results repeat that evaluation)
        steps = [2] if key.startswith(f"{names.EVALUATION}/") else [1, 2, 3]
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == steps, key


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


def _stacks(pid: int) -> str:
    """Every thread's Python stack in process ``pid`` (py-spy, of the lock's dev tools)."""
    spy = subprocess.run([str(Path(sys.executable).with_name("py-spy")), "dump", "--pid", str(pid)],
                         capture_output=True, text=True, timeout=60)
    return spy.stdout + spy.stderr


@pytest.mark.parametrize("sig, code, said", [
    (signal.SIGINT, 130, "interrupted"),
    pytest.param(signal.SIGTERM, 143, "terminated", marks=pytest.mark.slow),  # fast: StopRequest's tests
])
def test_ctrl_c_or_sigterm_stops_train_after_its_iteration_with_a_checkpoint(tmp_path, sig, code, said):
    """A Ctrl-C (SIGINT to the command), or SIGTERM (kill, a job's stop), mid-training: the
    iteration ends, its checkpoint is written and logged, the run ends KILLED, exit 130 or 143,
    no traceback (no abort in Ray's SIGTERM handler)."""
    uri = sqlite_store(tmp_path / "mlflow.db")
    proc = subprocess.Popen([sys.executable, "-m", "haepo_ray.cli", "train", "--env", "haepo/ChainMDP-v0",
                             "--stop-iters", "100000", "--num-cpus", "1", "--tracking-uri", uri, "--experiment", "c",
                             "--checkpoint-dir", str(tmp_path / "ck")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_as_in_a_terminal)
    try:
        for line in proc.stdout:  # the second iteration: training, and its run logging
            if line.startswith("iter") and int(line.split()[1]) == 2:
                break
        proc.send_signal(sig)
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired as timeout:  # say where it was
            pytest.fail(f"haepo train still ran 120 s after {sig.name}; its last output:\n"
                        f"{_text(timeout.output)[-1500:]}\n{_text(timeout.stderr)[-1500:]}\n"
                        f"its threads:\n{_stacks(proc.pid)}")
    finally:
        kill_tree(proc.pid)
    assert proc.returncode == code, err[-3000:]
    assert f"haepo train: {sig.name}: stopping after this iteration" in err, err[-3000:]
    assert err.rstrip().endswith(f"haepo train: {said}") and "Traceback" not in err, err[-3000:]
    assert f"checkpoint: {tmp_path / 'ck'}" in out and (tmp_path / "ck" / "rllib_checkpoint.json").exists()

    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("c").experiment_id])
    assert run.info.status == "KILLED"
    assert run.data.tags[names.CHECKPOINT] and client.list_artifacts(run.info.run_id)


def _signal_me_then_wait(*signums: int, wait_s: float = 10.0) -> None:
    for signum in signums:
        os.kill(os.getpid(), signum)
    time.sleep(wait_s)  # a handler that raises ends it first


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_first_signal_is_a_request_and_a_second_raises_at_once(sig, capsys):
    """The first Ctrl-C or SIGTERM raises nothing (a KeyboardInterrupt inside a queue's put would
    leave its lock held); a second raises what main reports, 130 or 143; leaving puts back the
    handlers found (here: ones of their own, as Tune's and Ray's are in haepo train)."""
    def found(signum, frame):
        pytest.fail("the handler found was called")

    before = {s: signal.signal(s, found) for s in STOP_SIGNALS}
    try:
        with StopRequest("haepo x", "after this step", grace_s=60) as request:
            _signal_me_then_wait(sig, wait_s=0.2)
            assert request.signum == sig
            expected = Terminated if sig == signal.SIGTERM else KeyboardInterrupt
            with pytest.raises(KeyboardInterrupt) as at_once:
                _signal_me_then_wait(sig)
            with pytest.raises(KeyboardInterrupt) as after:
                request.raise_if_received()
            assert at_once.type is expected and after.type is expected
        assert {s: signal.getsignal(s) for s in STOP_SIGNALS} == dict.fromkeys(STOP_SIGNALS, found)
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    assert capsys.readouterr().err.strip() == \
        f"haepo x: {sig.name}: stopping after this step ({'Ctrl-C' if sig == signal.SIGINT else 'SIGTERM'} " \
        "again stops at once)"


def test_a_signal_found_ignored_stays_ignored(capsys):
    """A command started with & or nohup ignores Ctrl-C: so does its request, before and after
    a second SIGTERM."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with StopRequest("haepo x", "after this step", grace_s=60) as request:
            _signal_me_then_wait(signal.SIGINT, wait_s=0.2)
            assert request.signum is None and signal.getsignal(signal.SIGINT) == signal.SIG_IGN
            _signal_me_then_wait(signal.SIGTERM, wait_s=0.2)
            with pytest.raises(Terminated):
                _signal_me_then_wait(signal.SIGTERM)
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
    assert "SIGINT" not in capsys.readouterr().err


def test_a_sigterm_not_stopped_within_its_grace_raises_terminated(capsys):
    """The platform's SIGKILL follows a SIGTERM (30 s in SLURM and Kubernetes): a step longer
    than the grace is interrupted so that the command still ends what it started."""
    start = time.monotonic()
    with StopRequest("haepo x", "after this step", grace_s=0.5) as request, pytest.raises(Terminated):
        _signal_me_then_wait(signal.SIGTERM)
    assert request.signum == signal.SIGTERM and 0.5 <= time.monotonic() - start < 5
    assert "haepo x: not stopped 0.5 s after SIGTERM: stopping at once" in capsys.readouterr().err


def test_a_command_stopped_in_time_is_not_interrupted_after_it(capsys):
    with StopRequest("haepo x", "after this step", grace_s=0.3) as request:
        _signal_me_then_wait(signal.SIGTERM, wait_s=0.1)
    time.sleep(0.6)  # the grace, which a stopped command cancels
    assert request.signum == signal.SIGTERM and "not stopped" not in capsys.readouterr().err


def test_main_reports_a_terminated_command_with_143(monkeypatch, capsys):
    from haepo_ray import cli

    def command(args):
        raise Terminated

    monkeypatch.setattr(cli, "cmd_version", command)
    assert cli.main(["version"]) == 143
    assert capsys.readouterr().err.strip() == "haepo version: terminated"


def test_after_an_interrupt_resume_is_advised_only_where_this_sweep_has_a_saved_state(ray_session, tmp_path):
    """``haepo sweep`` interrupted before Ray Tune took the signal over: ``--resume`` only where
    Tune saved this sweep's experiment state, never for an earlier sweep's (which ``--resume``
    would continue in this one's place), nor for a run with only the Tuner's own file (which
    ``--resume`` cannot restore)."""
    from ray import tune

    from haepo_ray.cli.sweep import after_interrupt

    root = str(tmp_path / "exp")

    def run(name: str, *, fit: bool = True) -> str:  # a real run folder: the Tuner's, after a fit Tune's state
        tuner = tune.Tuner(lambda config: None, run_config=tune.RunConfig(name=name, storage_path=root))
        if fit:
            tuner.fit()
        return f"{root}/{name}"

    again = "interrupted before Ray Tune saved the sweep's state: run the same command again"
    assert after_interrupt(root, None, resume=False) == again
    earlier = run("20261206-100000-aaaaaa")
    assert after_interrupt(root, earlier, False) == f"{again} (--resume would continue an earlier sweep, {earlier})"
    run("20261206-110000-bbbbbb", fit=False)  # this sweep's Tuner, interrupted before its fit saved a state
    assert after_interrupt(root, earlier, resume=False) == again
    this = run("20261206-120000-cccccc")
    for before, resume in ((earlier, False), (None, False), (None, True)):
        assert after_interrupt(root, before, resume) == (
            "interrupted before Ray Tune saved the sweep's last state: the same command with --resume continues it "
            f"from the state Tune saved in {this}")


def test_train_no_tracking_writes_nothing_to_mlflow(ray_session, tmp_path, monkeypatch, capsys):
    """In this process, on the session's Ray (the command's ray.init and ray.shutdown left out:
    the test above runs the command as a process of its own)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'env.db'}")
    monkeypatch.setattr(ray_session, "init", lambda *args, **kwargs: None)
    monkeypatch.setattr(ray_session, "shutdown", lambda: None)
    assert main(["train", "--env", "haepo/ChainMDP-v0", "--stop-iters", "1", "--num-cpus", "2",
                 "--set", "model_config={fcnet_hiddens: [8]}", "--no-tracking"]) == 0
    out = capsys.readouterr().out
    assert "MLflow" not in out and "checkpoint: " in out
    assert not (tmp_path / "env.db").exists() and not (tmp_path / ".haepo" / "mlflow.db").exists()


def test_train_restore_goes_on_from_a_checkpoint_with_its_settings(ray_session, tmp_path, monkeypatch, capsys):
    """--restore alone: the checkpoint's algorithm, env and settings (its model among them),
    --set over them; the run goes on from the checkpoint's iteration (the stop criteria count
    from its start) and names it in a tag. Refused, saying what to give: another --algo or
    --env, a checkpoint that has trained --stop-iters already, a --set that changes its model or
    that the run would not read, a folder that is no checkpoint or a damaged one, a --checkpoint-dir
    that holds a checkpoint or is below a file, each before an MLflow run starts (on the session's
    Ray, as above)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ray_session, "init", lambda *args, **kwargs: None)
    monkeypatch.setattr(ray_session, "shutdown", lambda: None)
    ck = tmp_path / "ck"
    assert main(["train", "--env", "haepo/ChainMDP-v0", "--set", "model_config={fcnet_hiddens: [8]}", "--seed", "3",
                 "--num-cpus", "2", "--stop-iters", "2", "--no-tracking", "--checkpoint-dir", str(ck)]) == 0
    capsys.readouterr()

    uri = sqlite_store(tmp_path / "mlflow.db")
    assert main(["train", "--restore", str(ck), "--set", "lr=0.01", "--stop-iters", "3", "--tracking-uri", uri,
                 "--experiment", "r", "--checkpoint-dir", str(tmp_path / "ck3")]) == 0
    out = capsys.readouterr().out
    assert f"restored: {ck} (iteration 2)" in out
    assert [line.split()[1] for line in out.splitlines() if line.startswith("iter")] == ["3"]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("r").experiment_id])
    tags, params = run.data.tags, run.data.params
    assert (tags[names.RESTORED_FROM], tags[names.ALGORITHM], tags[names.ENV], tags[names.SEED]) == \
        (str(ck), "HAEPO", "haepo/ChainMDP-v0", "3")
    assert params["lr"] == "0.01" and "8" in params["_model_config/fcnet_hiddens"], params
    assert [m.step for m in client.get_metric_history(run.info.run_id, names.TRAINING_ITERATION)] == [3]

    def refusal(*args: str) -> str:
        assert main(["train", "--restore", str(ck), *args, "--tracking-uri", uri, "--experiment", "refused"]) == 2
        return capsys.readouterr().err.strip()

    assert refusal("--algo", "GRPO") == (
        f"haepo train: error: --restore {ck} is a checkpoint of HAEPO on haepo/ChainMDP-v0, not of GRPO on "
        "haepo/ChainMDP-v0: leave out --algo and --env")
    assert "not of HAEPO on haepo/RandomWalk-v0" in refusal("--env", "haepo/RandomWalk-v0")
    assert refusal("--stop-iters", "2").endswith(
        f"--restore {ck} has trained 2 iterations already: give --stop-iters above 2 (the criteria count from "
        "its run's start)")
    assert "its state does not fit the HAEPO these settings build (a --set that changes the model?)" in \
        refusal("--set", "model_config={fcnet_hiddens: [4]}")
    assert refusal("--set", "reference_policy=behavior", "--set", "beta_kl=0.1").startswith(
        "haepo train: error: --set beta_kl: this run would not read it: the 'behavior' reference is the policy that "
        "sampled the batch")  # the --set judged on the checkpoint's settings (num_epochs 1)
    assert refusal("--set", "env_config={length: 0}").startswith(
        "haepo train: error: env_config: haepo/ChainMDP-v0 does not take {'length': 0}: ValueError: ")
    assert refusal("--checkpoint-dir", str(ck)) == (  # the checkpoint it goes on from, as any other
        f"haepo train: error: --checkpoint-dir {ck} holds an earlier run's rllib_checkpoint.json, which this run "
        "would overwrite: give a new folder (or remove that one)")
    assert refusal("--checkpoint-dir", str(ck / "rllib_checkpoint.json" / "new")) == (
        f"haepo train: error: --checkpoint-dir {ck / 'rllib_checkpoint.json' / 'new'}: "
        f"{ck / 'rllib_checkpoint.json'} is a file, not a folder")
    damage = {  # a checkpoint copied in part, or cut short: named, not a traceback nor a fresh start
        "rllib_checkpoint.json": ("{", " is not a whole RLlib checkpoint (JSONDecodeError: "),
        "class_and_ctor_args.pkl": (b"\x80", " is not a whole RLlib checkpoint: its class_and_ctor_args.pkl cannot be "
                                    "read (UnpicklingError: "),
        "learner_group/learner": (None, " is not a whole RLlib checkpoint: it has no learner_group/learner/ (the "
                                  "weights and optimiser), and restoring would go on from new ones without a word"),
        "learner_group/learner/state.pkl": (0.5, ": a state file in it is damaged or cut short (UnpicklingError: "),
    }
    for name, (content, message) in damage.items():
        damaged = tmp_path / "damaged" / name.replace("/", "_")
        shutil.copytree(ck, damaged)
        if content is None:
            shutil.rmtree(damaged / name)
        elif isinstance(content, float):
            (damaged / name).write_bytes((ck / name).read_bytes()[:int(content * (ck / name).stat().st_size)])
        else:
            (damaged / name).write_bytes(content.encode() if isinstance(content, str) else content)
        assert main(["train", "--restore", str(damaged), "--tracking-uri", uri, "--experiment", "refused"]) == 2
        assert f"haepo train: error: --restore {damaged}{message}" in capsys.readouterr().err, name
    assert client.get_experiment_by_name("refused") is None, "a refusal started an MLflow run"
    assert main(["train", "--restore", str(tmp_path), "--no-tracking"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        f"--restore {tmp_path} is not an RLlib checkpoint (no rllib_checkpoint.json): give the folder haepo "
        "train printed, or a sweep trial's checkpoint_NNNNNN")


@pytest.mark.parametrize(("address", "message"), [
    ("http://127.0.0.1:8265", "an HTTP address is a head's dashboard, where haepo submit sends jobs; haepo sweep "
     "joins a running Ray at its GCS address, HOST:6379"),
    ("ray://127.0.0.1:10001", "Ray Client addresses are not supported"),
    ("head", "expected HOST:PORT, the head's GCS address, or auto"),
    ("127.0.0.1:PORT", "no Ray head answers there (Connection refused): check the address (the head's GCS port"),
])
def test_sweep_refuses_an_address_where_no_ray_head_answers_at_once(address, message, tmp_path, monkeypatch, capsys):
    """Before, ray.init retried a refused port for minutes, and an HTTP address was Ray's traceback.
    Nothing is made: no MLflow store, no results folder."""
    import ray

    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("ray.init called"))
    monkeypatch.chdir(tmp_path)
    address = address.replace("PORT", str(free_port()))
    assert main(["sweep", str(SMOKE), "--address", address]) == 2
    assert f"haepo sweep: error: --address {address}: {message}" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_train_refuses_more_cpus_than_its_ray_has(ray_session, tmp_path, monkeypatch, capsys):
    """3 env runners and the main process on the session's 2-CPU Ray: RLlib's env runners would
    wait for ever; the command says so instead (on the session's Ray, as above)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ray_session, "init", lambda *args, **kwargs: None)
    assert main(["train", "--env", "haepo/ChainMDP-v0", "--set", "num_env_runners=3", "--no-tracking"]) == 2
    assert "haepo train: error: HAEPO asks for 4 CPUs (its main process, env runners and learners), but the " \
           "local Ray has 2 (--num-cpus): it would wait for ever." in capsys.readouterr().err


@pytest.mark.parametrize("algo", ["DPO", "GRPO"])
def test_train_knows_the_baselines(algo):
    from haepo_ray.cli.train import train_config

    config = train_config(algo, "haepo/ChainMDP-v0", 0, {"lr": 0.05})
    assert type(config).__name__ == f"{algo}Config" and config.lr == 0.05
