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


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    """The test uses a module-scoped fixture (a cluster, a server, a sweep its module's tests
    read): pytest starts it once per process that runs a test of the module."""
    return any(defs[-1].scope == "module" for defs in item._fixtureinfo.name2fixturedefs.values())


def pytest_itemcollected(item: pytest.Item) -> None:
    """`make test` runs 2 pytest-xdist workers with ``--dist loadgroup``: each worker takes the
    next test as it runs short, so the two end together, except that the tests sharing a
    module-scoped fixture go to one worker together (an ``xdist_group`` named after their
    module), where that fixture starts once. xdist hands out those groups first, largest first:
    the single tests after them even out the workers."""
    if _shares_a_module_fixture(item):
        item.add_marker(pytest.mark.xdist_group(item.path.name))


@pytest.hookimpl(trylast=True)  # after pytest-xdist's worker has tried
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each grouped test's id ends in ``@<group>``, which is how pytest-xdist's worker tells its
    scheduler the group. pytest-xdist 3.8 writes that id into ``item._nodeid``, which pytest 9.2
    no longer reads (its ids are structured): every test was scheduled alone, and a module's
    fixture started once per worker (pytest-dev/pytest-xdist#1386). Here the structured id gets
    the suffix where xdist's did not take; an xdist that sets it itself leaves nothing to do."""
    if not getattr(config.option, "loadgroup", False):  # set in xdist's workers under --dist loadgroup
        return
    for item in items:
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                         for m in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(groups)
        if groups and not item.nodeid.endswith(suffix):
            item._id = type(item._id).parse(item.nodeid + suffix)
            if not item.nodeid.endswith(suffix):
                raise pytest.UsageError(f"cannot give {item.nodeid} its xdist group {groups}")
