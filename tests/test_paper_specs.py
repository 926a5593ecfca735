"""The paper's RL experiment specs state the discount they train with (the language-model
specs, tldr_*.yaml, have no discount: a completion's reward is its return)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

PAPER = Path(__file__).resolve().parents[1] / "tune_configs" / "paper"
SPECS = sorted(p for p in PAPER.glob("*.yaml") if not p.name.startswith("tldr_"))


def test_the_language_model_specs_are_the_only_ones_left_out():
    left_out = sorted(p.name for p in PAPER.glob("*.yaml") if p not in SPECS)
    assert left_out == ["tldr_dpo.yaml", "tldr_grpo.yaml", "tldr_haepo.yaml"]
    assert all("llm" in yaml.safe_load((PAPER / name).read_text()) for name in left_out)


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
    if spec["env"] == "CartPole-v1":  # the paper's CartPole discount; RL Zoo3's for its tuned PPO
        assert gamma == (0.98 if path.stem == "cartpole_ppo_tuned" else 0.99), path.name
