"""Where a sweep's runs go and how a new run is named (haepo_ray/sweep/paths.py)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from haepo_ray import cli
from haepo_ray.sweep import paths
from haepo_ray.sweep.kinds import load_plan


def _frozen_clock(monkeypatch, seconds: list[str]) -> list[float]:
    """``time.strftime`` gives the start times in ``seconds``, one per call, then the last one;
    ``time.sleep`` waits no time and is recorded (returned)."""
    stamps = iter(seconds)
    last = [seconds[0]]
    real = time.strftime
    # parsed before strftime is patched: strptime's first call imports _strptime, which calls strftime
    parsed = {stamp: time.strptime(stamp, "%Y%m%d-%H%M%S") for stamp in seconds}

    def strftime(fmt: str, *args) -> str:
        last[0] = next(stamps, last[0])
        return real(fmt, parsed[last[0]])

    slept: list[float] = []
    monkeypatch.setattr(paths.time, "strftime", strftime)
    monkeypatch.setattr(paths.time, "sleep", slept.append)
    return slept


def test_runs_of_two_experiments_started_in_one_second_have_two_names(tmp_path, monkeypatch):
    """A run's name is Tune's experiment name, and Tune stages a run's files in
    ``<Ray session>/artifacts/<start second>/<experiment name>`` on the driver: two sweeps of
    two specs started in one second on one Ray shared that folder while the name was the start
    time alone (test_postgres's two sweeps: one was resumed with the other's trials)."""
    _frozen_clock(monkeypatch, ["20261127-004808"] * 2)
    (a, _), (b, _) = (paths.new_run_dir(str(tmp_path / name)) for name in ("pg-steady", "pg-resumed"))
    assert a != b
    assert all(re.fullmatch(r"20261127-004808-[0-9a-f]{6}", n) for n in (a, b)), (a, b)


def test_a_second_run_of_one_experiment_in_the_same_second_waits_for_the_next(tmp_path, monkeypatch):
    """``--resume`` takes the newest run by name: a run of the same experiment started in the
    second of an earlier one takes the next second."""
    slept = _frozen_clock(monkeypatch, ["20261127-004808", "20261127-004808", "20261127-004809"])
    root = tmp_path / "smoke"
    first, _ = paths.new_run_dir(str(root))
    (root / first).mkdir(parents=True)  # Tune makes it
    second, _ = paths.new_run_dir(str(root))
    assert slept == [1.0]
    assert first.startswith("20261127-004808-") and second.startswith("20261127-004809-")
    assert sorted([second, first], reverse=True)[0] == second


@pytest.mark.parametrize("name", ["a/b", "../x", "a\\b", "..", ".", ""])
def test_an_experiment_that_is_not_one_folder_is_refused(name, tmp_path, capsys):
    """The experiment names the one folder of a sweep's runs under the root: ``a/b`` put its
    runs among experiment ``a``'s, ``../x`` left the root."""
    spec = load_plan(Path(__file__).parents[1] / "tune_configs" / "smoke.yaml").spec
    with pytest.raises(ValueError, match=re.escape(f"experiment {name!r}: it names one folder")):
        paths.experiment_root(spec, name or None, str(tmp_path)) if name else paths.check_experiment(name)
    for command in (["sweep", "tune_configs/smoke.yaml", "--dry-run"], ["submit", "tune_configs/smoke.yaml"]):
        with pytest.raises(SystemExit) as exit:
            cli.main([*command, "--experiment", name])
        assert exit.value.code == 2
        assert f"argument --experiment: experiment {name!r}: it names one folder" in capsys.readouterr().err
    assert paths.experiment_root(spec, "my sweep", str(tmp_path)) == f"{tmp_path}/my sweep"
