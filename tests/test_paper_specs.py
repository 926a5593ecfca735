"""The paper's experiment specs state the discount they train with."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

PAPER = Path(__file__).resolve().parents[1] / "tune_configs" / "paper"
SPECS = sorted(PAPER.glob("*.yaml"))


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_every_paper_spec_states_gamma(path):
    """RLlib's default 0.99 would turn the random walk's R in {0, 1} into 0.99^(T-1)."""
    spec = yaml.safe_load(path.read_text())
    settings = spec["settings"]
    assert "gamma" in settings, f"{path.name}: settings.gamma missing"
    gamma = settings["gamma"]
    assert 0.0 < gamma <= 1.0
    if spec["algorithm"] in ("HAEPO", "DPO") and spec["env"] in ("haepo/RandomWalk-v0", "haepo/ChainMDP-v0"):
        assert gamma == 1.0, f"{path.name}: the paper's return is in {{0, 1}}"
    if spec["env"] == "CartPole-v1":
        assert gamma == 0.99, f"{path.name}: the paper's CartPole discount"
