"""Simulations kept on disk (haepo_ray.llm.capacity.stored): a hit equals the simulation, and
any change of what a simulation depends on is a miss."""

from __future__ import annotations

import dataclasses
import json
import os
import stat

import pytest

from haepo_ray.llm.capacity import estimate as estimate_module
from haepo_ray.llm.capacity import simulate as simulate_module
from haepo_ray.llm.capacity import stored
from haepo_ray.llm.capacity.estimate import estimate
from haepo_ray.llm.settings import LLMTrainSettings

SETTINGS = LLMTrainSettings(model="tiny", algo="HAEPO", batch_prompts=2, group_size=2, sft_batch=2,
                            max_new_tokens=4, micro_batch_size=2)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty $HAEPO_CACHE, and the in-process cache emptied before and after."""
    monkeypatch.setenv("HAEPO_CACHE", str(tmp_path / "cache"))
    estimate_module._cached.cache_clear()
    yield tmp_path / "cache" / "estimates"
    estimate_module._cached.cache_clear()


def _no_simulation(monkeypatch) -> None:
    """From here on a simulation fails the test: what ``estimate`` returns comes from disk."""
    estimate_module._cached.cache_clear()
    monkeypatch.setattr(simulate_module, "simulate", lambda *a, **k: pytest.fail("simulated again"))


def test_a_stored_simulation_is_the_simulation(cache, monkeypatch):
    old_umask = os.umask(0o022)  # a cache others may read: rw-r--r--, as the umask gives any new file
    try:
        first = estimate(SETTINGS, prompt_tokens=16)
    finally:
        os.umask(old_umask)
    (path,) = cache.iterdir()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    _no_simulation(monkeypatch)
    assert estimate(SETTINGS, prompt_tokens=16) == first
    assert estimate(dataclasses.replace(SETTINGS, seed=7, lr=1e-3), prompt_tokens=16) == first  # no memory field
    assert [p.name for p in cache.iterdir()] == [path.name]


@pytest.mark.parametrize("change", ["prompt_tokens", "memory setting", "target", "source", "library"])
def test_a_change_of_what_the_simulation_depends_on_is_a_miss(cache, monkeypatch, change):
    estimate(SETTINGS, prompt_tokens=16)
    _no_simulation(monkeypatch)
    settings, kwargs = SETTINGS, {"prompt_tokens": 16}
    if change == "prompt_tokens":
        kwargs["prompt_tokens"] = 17
    elif change == "memory setting":
        settings = dataclasses.replace(SETTINGS, micro_batch_size=1)
    elif change == "target":
        kwargs["target"] = "cpu"
    elif change == "source":
        monkeypatch.setattr(stored, "_source_digest", lambda: "another source")
    else:
        monkeypatch.setattr(stored, "_version", lambda name: "9.9" if name == "transformers" else "1.0")
    with pytest.raises(pytest.fail.Exception, match="simulated again"):
        estimate(settings, **kwargs)


def test_an_unreadable_file_is_simulated_again_and_a_folder_that_cannot_be_written_is_left(cache, tmp_path,
                                                                                           monkeypatch):
    first = estimate(SETTINGS, prompt_tokens=16)
    (path,) = cache.iterdir()
    for broken in ("{not json", json.dumps({"algo": "HAEPO"}), ""):
        path.write_text(broken)
        estimate_module._cached.cache_clear()
        assert estimate(SETTINGS, prompt_tokens=16) == first
        assert json.loads(path.read_text())["phases"], "not written again"
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("HAEPO_CACHE", str(tmp_path / "a-file"))  # estimates/ cannot be made below a file
    estimate_module._cached.cache_clear()
    assert estimate(SETTINGS, prompt_tokens=16) == first
    assert [p.name for p in cache.iterdir()] == [path.name]  # no temporary file left behind
