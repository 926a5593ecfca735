"""Shared fixtures: one real local Ray per test session."""

from __future__ import annotations

import os

import pytest

# Keep Ray from probing the machine's GPUs, dashboards and usage reporting in tests.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session")
def ray_session():
    """A real local Ray instance with 2 CPUs, shared by every test that asks for it."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    from haepo_ray.envs import register_with_ray

    register_with_ray()
    yield ray
    ray.shutdown()
