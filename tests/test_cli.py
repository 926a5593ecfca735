"""The `haepo` command: in this process (help, versions, environments, usage errors), and
training as a real subprocess."""

from __future__ import annotations

import subprocess
import sys

import pytest

from haepo_ray.cli import main
from haepo_ray.envs import registered_envs


def haepo(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "haepo_ray.cli", *args],
        capture_output=True, text=True, timeout=timeout,
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
        (["--env", "haepo/ChainMDP-v0", "--set", "not_a_setting=1"], "HAEPOConfig has no setting(s) ['not_a_setting']"),
        (["--env", "haepo/ChainMDP-v0", "--set", "beta_ent=-1"], "beta_ent must be a finite number >= 0"),
        (["--env", "haepo/ChainMDP-v0", "--set", "lr"], "--set expects key=value"),
    ],
)
def test_train_rejects_bad_input_before_starting_ray(args, message, capsys, monkeypatch):
    """In this process (each subprocess would import RLlib again): exit status 2 and the
    message, not an exception, and Ray is never started."""
    import ray

    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started"))
    assert main(["train", *args]) == 2
    assert message in capsys.readouterr().err


def test_train_runs_and_writes_a_loadable_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt"
    out = haepo(
        "train", "--env", "haepo/ChainMDP-v0", "--stop-iters", "3", "--seed", "1",
        "--num-cpus", "2", "--set", "lr=0.05", "--set", "model_config={fcnet_hiddens: [8]}",
        "--checkpoint-dir", str(ckpt),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    progress = [line for line in out.stdout.splitlines() if line.startswith("iter")]
    assert [int(line.split()[1]) for line in progress] == [1, 2, 3]
    assert "H(w)" in progress[0] and "KL" in progress[0]
    assert f"checkpoint: {ckpt}" in out.stdout

    from ray.rllib.core.rl_module.rl_module import RLModule

    module = RLModule.from_checkpoint(ckpt / "learner_group" / "learner" / "rl_module" / "default_policy")
    assert sum(p.numel() for p in module.parameters()) > 0


@pytest.mark.parametrize("algo", ["DPO", "GRPO"])
def test_train_knows_the_baselines(algo):
    from haepo_ray.cli.train import train_config

    config = train_config(algo, "haepo/ChainMDP-v0", 0, {"lr": 0.05})
    assert type(config).__name__ == f"{algo}Config" and config.lr == 0.05
