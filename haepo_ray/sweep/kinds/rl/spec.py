"""An RL sweep's keys: an RLlib ``algorithm`` on an ``env`` (with ``env_config``), which a
``stop`` rule ends. The format is :mod:`haepo_ray.sweep.spec`'s."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from haepo_ray.sweep.spec import StopSpec, SweepSpec

__all__ = ["SPEC", "RLSweepSpec", "claims"]


class RLSweepSpec(SweepSpec):
    """A spec of RL trials: an RLlib algorithm on an env, which a stop rule ends."""

    algorithm: str  # HAEPO, PPO or any algorithm registered with Ray Tune
    env: str  # a haepo env id or a gymnasium id
    env_config: dict[str, Any] = Field(default_factory=dict)  # kwargs of the env
    stop: StopSpec


SPEC = RLSweepSpec


def claims(data: Mapping[str, Any]) -> bool:
    """Every spec is an RL sweep unless a kind listed before this one claims it."""
    return True
