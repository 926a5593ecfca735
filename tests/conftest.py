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


@pytest.fixture(scope="session")
def tiny_lm():
    """A random 2-layer Llama in float64 with a word-level tokenizer trained on a few sentences.

    Shared by the LM tests: they must not change its weights, and zero its gradients.
    """
    from haepo_ray.llm.models import tiny_model

    texts = ["the model writes a short summary of the paper", "we propose a method for parsing",
             "results show the method improves accuracy", "a cat sat on the mat"]
    model, tokenizer = tiny_model(texts, seed=0, vocab_size=64, hidden_size=16)
    return model.double().eval(), tokenizer
