"""Shared fixtures: one real local Ray per test session (per pytest-xdist worker)."""

from __future__ import annotations

import hashlib
import os

import pytest

# Keep Ray from probing the machine's GPUs, dashboards and usage reporting in tests.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


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


# How long the slow modules take in `make test`, in seconds: their tests' setup + call +
# teardown summed (`make test PYTEST_ARGS=--durations=0`), measured 2026-11-25 00:30-00:40 UTC
# on the 2-core machine (541 tests in 10 min 20 s; light edits beside it). Under pytest-xdist
# each module runs whole on one worker (--dist loadfile, --no-loadscope-reorder) and a worker
# takes the next module from this order when it is down to its last two tests: longest first
# keeps a long module from running alone at the end while the other worker idles. A module not
# listed runs after these, in file order, so a new slow module needs its line here.
MODULE_SECONDS = {
    "test_llm_sweep.py": 185,
    "test_sweep_e2e.py": 160,
    "test_postgres.py": 130,
    "test_sweep_spec.py": 125,
    "test_multinode.py": 120,
    "test_algorithm.py": 115,
    "test_report_bulk.py": 90,  # measured alone 2026-11-25 05:46 UTC at load 4.5 (server start 11 s, store 33 s)
    "test_llm_capacity.py": 75,
    "test_llm_train.py": 60,
    "test_tracking.py": 40,
    "test_report.py": 40,
    "test_tune_private.py": 30,  # alone 2026-11-25 15:48 UTC at load 12: 49 s (a 12-trial sweep)
    "test_provenance.py": 30,
    "test_cli.py": 25,
    "test_baselines.py": 20,
    "test_dashboards.py": 18,
    "test_rllib_patches.py": 18,  # alone 2026-11-25 15:17 UTC: 20 s (two algorithm builds)
    "test_listwise.py": 17,
    "test_report_llm.py": 12,
    "test_sampling.py": 8,
    "test_cluster_files.py": 7,
    "test_devices.py": 6,
    "test_llm_eval_form.py": 3,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: -MODULE_SECONDS.get(item.path.name, 0))  # stable within a module
