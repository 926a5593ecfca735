"""Shared fixtures: one real local Ray per test session (per pytest-xdist worker)."""

from __future__ import annotations

import hashlib
import os

import pytest

# Keep Ray from probing the machine's GPUs, dashboards and usage reporting in tests.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# One OpenMP thread per process (torch's intra-op pool), as Ray gives its workers: the tests'
# own processes (2 pytest-xdist workers, the sweep drivers and commands they start) share 2
# cores with Ray's actors, and a pool of one thread per core waits on the busy core at every
# op (test_llm_train alone on this 2-core machine: 52 s with the default pool, 21 s with one
# thread). Set before anything imports torch; a value the shell sets wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def ray_temp_dir() -> str:
    """This worker's Ray folder. Under pytest-xdist two workers run two local Rays at once:
    each gets its own folder (session links, metrics service-discovery file), short enough
    for Ray's unix sockets. Two checkouts testing at once (git worktrees) get their own too."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    checkout = hashlib.sha1(os.path.dirname(os.path.dirname(__file__)).encode()).hexdigest()[:6]
    return f"/tmp/ray-haepo-{os.getuid()}-{checkout}-{worker}"


@pytest.fixture(scope="session")
def ray_session():
    """A real local Ray instance with 2 CPUs, shared by every test (of this worker) that asks."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=ray_temp_dir())
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
