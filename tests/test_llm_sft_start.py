"""Shared SFT starts (haepo_ray.llm.sft_start): one SFT per key, loaded by every other method,
safe against a killed maker and a concurrent asker."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path

import pytest
import torch

from haepo_ray import names
from haepo_ray.llm.settings import LLMTrainSettings
from haepo_ray.llm.sft_start import LOADED, MADE, MARKER, OWN, begin_rl, is_complete, start_key
from haepo_ray.llm.train import GENERATIONS_FILE, START_EVAL_FILE, LLMRun

REPO = Path(__file__).resolve().parents[1]


def _settings(**overrides):
    base = dict(model="tiny", sft_examples=4, sft_batch=2, rl_updates=1, batch_prompts=1, group_size=2,
                max_new_tokens=4, max_source_words=16, eval_prompts=2, micro_batch_size=0, seed=0)
    return LLMTrainSettings(**{**base, **overrides})


def _state(run: LLMRun) -> dict[str, torch.Tensor]:
    """The RL-ready policy's weights: the model's and the reference's."""
    state = {f"model.{k}": v.clone() for k, v in run.model.state_dict().items()}
    if run.policy.reference is not None:
        state.update({f"reference.{k}": v.clone() for k, v in run.policy.reference.state_dict().items()})
    return state


def _identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def test_the_key_is_what_sft_depends_on():
    key = start_key(_settings())
    for rl_only in ({"algo": "GRPO"}, {"lr": 1e-3}, {"beta_kl": 0.5}, {"rl_updates": 7}, {"group_size": 3},
                    {"gradient_checkpointing": True}, {"lora_alpha": 8.0}, {"device": "cpu"}):
        assert start_key(_settings(**rl_only)) == key, rl_only
    for sft in ({"seed": 1}, {"sft_lr": 1e-3}, {"sft_examples": 6}, {"sft_batch": 4}, {"dtype": "float64"},
                {"split_seed": 1}, {"eval_prompts": 3}, {"max_source_words": 8}, {"lora_r": 2},
                {"data": "tldr:x.jsonl"}, {"model": "smollm2"}, {"aspect": "outcome"}):
        assert start_key(_settings(**sft)) != key, sft
    assert start_key(_settings(lora_r=2, lora_alpha=8.0)) != start_key(_settings(lora_r=2))
    assert start_key(_settings(dtype="bfloat16", rounding="stochastic")) != start_key(_settings(dtype="bfloat16"))


@pytest.mark.parametrize("lora", [{}, {"lora_r": 2}])
def test_two_methods_of_a_seed_begin_rl_from_identical_weights_and_sft_runs_once(tmp_path, lora):
    starts = tmp_path / "sft_starts"
    maker = LLMRun(_settings(algo="HAEPO", **lora), tmp_path / "haepo")
    assert begin_rl(maker, starts) == MADE
    loader = LLMRun(_settings(algo="GRPO", lr=1e-3, **lora), tmp_path / "grpo")
    before = _state(loader)
    assert begin_rl(loader, starts) == LOADED
    assert _identical(_state(maker), _state(loader))
    assert not _identical(before, _state(loader))  # SFT moved the weights: the load is not a no-op
    assert loader.rows == maker.rows and [r["phase"] for r in loader.rows] == ["sft", "sft"]
    # the loader's clock counts the maker's SFT seconds, so their train_time_s compare
    assert loader.clock.phases["sft"] == maker.clock.phases["sft"] > 0
    assert [p.name for p in starts.iterdir() if p.is_dir()] == [start_key(maker.settings)]
    # another seed has its own start
    other = LLMRun(_settings(algo="GRPO", seed=1, **lora), tmp_path / "seed1")
    assert begin_rl(other, starts) == MADE
    assert not _identical(_state(maker), _state(other))
    for run in (maker, loader, other):
        run.close()


def test_rl_after_a_loaded_start_is_that_after_the_start_made(tmp_path):
    """The loader's RL run (its optimiser on its own lr) equals a run that made the start itself."""
    made = LLMRun(_settings(algo="GRPO", lr=1e-2, rl_updates=2), tmp_path / "made")
    assert begin_rl(made, None) == OWN
    starts = tmp_path / "starts"
    maker = LLMRun(_settings(algo="HAEPO"), tmp_path / "maker")
    begin_rl(maker, starts)
    loaded = LLMRun(_settings(algo="GRPO", lr=1e-2, rl_updates=2), tmp_path / "loaded")
    assert begin_rl(loaded, starts) == LOADED
    rows = [[r["loss"] for r in run.rl()] for run in (made, loaded)]
    assert rows[0] == rows[1]
    assert _identical(_state(made), _state(loaded))


def test_the_sft_start_is_evaluated_once_before_rl_and_its_evaluation_shared(tmp_path):
    """With eval_start the maker evaluates the start before any update; a loader with the same
    evaluation settings takes that evaluation (as update 0, its first row's eval_start), one
    with other settings evaluates the start itself."""
    starts = tmp_path / "starts"
    runs = {name: LLMRun(_settings(algo=algo, eval_start=True, **extra), tmp_path / name)
            for name, algo, extra in (("maker", "HAEPO", {}), ("loader", "DPO", {"dpo_pairs": "reward"}),
                                      ("other", "GRPO", {"eval_samples": 2}))}
    assert begin_rl(runs["maker"], starts) == MADE
    shared = starts / start_key(runs["maker"].settings) / START_EVAL_FILE
    made = json.loads(shared.read_text())
    made[names.LLM_EVAL]["greedy"][names.LLM_REWARD] = -1.0  # a mark: the loader's must be this file's
    shared.write_text(json.dumps(made))
    assert [begin_rl(runs[name], starts) for name in ("loader", "other")] == [LOADED, LOADED]
    rows = {name: list(run.rl()) for name, run in runs.items()}
    for run in runs.values():
        run.close()
    start = {name: r[0][names.LLM_EVAL_START] for name, r in rows.items()}
    assert start["loader"]["greedy"][names.LLM_REWARD] == -1.0
    assert start["loader"]["sampled"] == start["maker"]["sampled"]
    assert start["other"]["greedy"][names.LLM_REWARD] == pytest.approx(start["maker"]["greedy"][names.LLM_REWARD])
    for name, run in runs.items():
        records = [json.loads(line) for line in (run.out / GENERATIONS_FILE).read_text().splitlines()]
        assert [r["update"] for r in records] == [0] * 2 + [1] * 2  # eval_prompts 2: the start, then update 1
        assert {r["algorithm"] for r in records} == {run.settings.algo}


def test_a_killed_makers_leftovers_are_not_loaded(tmp_path):
    """A partial folder (the maker killed while writing) and a start folder without its marker
    are remade, not loaded."""
    starts = tmp_path / "sft_starts"
    settings = _settings()
    key = start_key(settings)
    for leftover in (starts / f"{key}.partial", starts / key):
        leftover.mkdir(parents=True)
        (leftover / "state.pt").write_bytes(b"half a tensor")
        (leftover / "metrics.jsonl").write_text('{"update": 1, "phase": "sft"')
    run = LLMRun(settings, tmp_path / "run")
    assert begin_rl(run, starts) == MADE
    assert is_complete(starts / key) and not (starts / f"{key}.partial").exists()
    again = LLMRun(settings, tmp_path / "again")
    assert begin_rl(again, starts) == LOADED
    assert _identical(_state(run), _state(again))


def test_a_second_asker_waits_for_the_maker_and_loads(tmp_path):
    """Two trials ask at once: the second blocks on the lock while the first runs SFT (slowed
    by its row callback), then loads the start instead of training."""
    starts = tmp_path / "sft_starts"
    in_sft = threading.Event()

    def slow(row):
        in_sft.set()
        time.sleep(0.5)

    first = LLMRun(_settings(algo="HAEPO"), tmp_path / "first", callback=slow)
    second = LLMRun(_settings(algo="DPO"), tmp_path / "second")
    outcome = {}
    makes = threading.Thread(target=lambda: outcome.update(first=begin_rl(first, starts)))
    makes.start()
    assert in_sft.wait(60)
    asks = threading.Thread(target=lambda: outcome.update(second=begin_rl(second, starts)))
    asks.start()
    makes.join(60)
    asks.join(60)
    assert outcome == {"first": MADE, "second": LOADED}
    assert _identical(_state(first), _state(second))
    assert (starts / start_key(first.settings) / MARKER).is_file()
    assert second.rows == first.rows and all(r["phase"] == "sft" for r in second.rows)


def test_dry_run_shows_which_trials_share_a_start():
    from haepo_ray.sweep.dry_run import dry_run
    from haepo_ray.sweep.kinds import load_plan

    plan = load_plan(REPO / "tune_configs" / "llm_smoke.yaml")
    out = io.StringIO()
    trials = dry_run(plan, out=out)
    header, _, *rows = out.getvalue().split("\n  6 trials:\n")[1].splitlines()
    assert header.split()[-2:] == ["SFT", "start"]  # the last column
    shown = {(row.split()[1], row.split()[2]): row.split()[-1] for row in rows}
    for t in trials:
        key = start_key(plan.trial_config(t.values))
        assert shown[(t.values["algorithm"], str(t.values["seed"]))] == key[:12]
    assert len(set(shown.values())) == 2  # one per seed
