"""``haepo report`` on language-model sweeps: a real SQLite MLflow store holding the runs a
language-model sweep writes (haepo_ray.sweep.kinds.llm.trainable through the tracking callback: tag
``haepo.model``, one step per RL update), with values chosen so every table cell is a sum by
hand. No model is trained here (tests/test_llm_sweep.py runs a real sweep). Each metric is
logged three times, as a trial logs it: the held-out evaluation's greedy (``eval/greedy/*``)
and sampled (``eval/sampled/*``, SAMPLED_SHIFT lower) values, and the training samples' (the
bare name, TRAINING_SHIFT higher), which the report must never show.

The store: experiment ``llm-report``, model ``tiny`` on ``aclsum``: GRPO and DPO with one
configuration and HAEPO with two learning rates, 2 seeds each, 3 updates; and experiment
``rl-next-door`` with one RL trial, so one report holds both kinds.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from chromium import (assert_highlighted, assert_legend_toggles, assert_offline, assert_zoom_and_reset, chart,
                      check_page, column, filter_rows, hover, hover_bar, offline_page, sort_by, tick_row, tooltip_value)
from helpers import sqlite_store

from haepo_ray import names
from haepo_ray.report import build_report, to_text
from haepo_ray.report.aggregate import group_trials, results_table
from haepo_ray.report.figures import write_figures
from haepo_ray.report.kinds import LLM, memory_phase
from haepo_ray.report.llm_results import METHODS_TITLE
from haepo_ray.report.rl_results import RL_TITLE
from haepo_ray.report.optimised import OPTIMISED_TITLE
from haepo_ray.report.runs import Trial

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("HAEPO_TEST_ARTIFACTS", REPO / ".haepo" / "test-artifacts"))
EXPERIMENT = "llm-report"
UPDATES = 3
SFT_S = 5.0  # train_time_s counts the SFT steps before the first update
# (algorithm, lr) -> base value of each metric; a trial logs base + SEED_STEP * seed + SLOPE * update.
BASE = {
    ("DPO", 5e-5): {names.LLM_REWARD: 0.2, names.LLM_ROUGE_L: 0.10, "memory": 1000.0, "time": 2.0},
    ("GRPO", 5e-5): {names.LLM_REWARD: 0.4, names.LLM_ROUGE_L: 0.20, "memory": 1400.0, "time": 3.0},
    # 0.35: its final reward, 0.75, sorts after 0.6 as a number but after 0.9 as text ("75" > "9").
    ("HAEPO", 1e-5): {names.LLM_REWARD: 0.35, names.LLM_ROUGE_L: 0.15, "memory": 1100.0, "time": 1.0},
    ("HAEPO", 5e-5): {names.LLM_REWARD: 0.5, names.LLM_ROUGE_L: 0.25, "memory": 1100.0, "time": 1.0},
}
OTHER = {names.LLM_SEMANTIC_SIMILARITY: 0.6, names.LLM_PROFANITY_RATE: 0.0, names.LLM_COMPLETION_LENGTH: 20.0,
         names.LLM_KL: 0.01, names.LLM_EFFECTIVE_NUM_TRAJECTORIES: 3.0, names.LLM_LOSS: 1.0}
SEED_STEP, SLOPE = 0.2, 0.1
SAMPLED_SHIFT, TRAINING_SHIFT = 0.05, 100.0
PHASE_SHARE = {"generation": 1.0, "reference": 0.5, "forward_backward": 2.0, "optimizer": 1.5}  # x memory


def _row(base: dict, seed: int, update: int) -> dict[str, float]:
    """One update's metric row, as the trainable reports it."""
    def move(value: float) -> float:
        return value + SEED_STEP * seed + SLOPE * update

    time_s = base["time"] + 0.5 * seed
    values = {**{k: move(base[k]) for k in (names.LLM_REWARD, names.LLM_ROUGE_L)},
              **{k: move(v) for k, v in OTHER.items()}}
    return {
        names.LLM_UPDATE: update,
        **{k: v + TRAINING_SHIFT for k, v in values.items()},
        **{names.llm_eval(k): v for k, v in values.items()},
        **{names.llm_eval(k, "sampled"): v - SAMPLED_SHIFT for k, v in values.items()},
        names.llm_eval(names.LLM_EXACT_KL, names.LLM_EVAL_POLICY): values[names.LLM_KL],  # the exact KL
        names.LLM_UPDATE_TIME: time_s,
        names.LLM_TRAIN_TIME: SFT_S + update * time_s,
        names.TIME_TOTAL_S: 30.0 + update * time_s,
        **{memory_phase(p): share * base["memory"] + 10 * update + 100 * seed for p, share in PHASE_SHARE.items()},
    }


def _log(client, run_id: str, rows: list[dict[str, float]], step_key: str) -> None:
    from mlflow.entities import Metric

    metrics = [Metric(key, float(value), 0, int(row[step_key])) for row in rows for key, value in row.items()]
    client.log_batch(run_id, metrics=metrics)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("report-llm")
    uri = sqlite_store(root / "mlflow.db")
    client = MlflowClient(uri)
    exp = client.create_experiment(EXPERIMENT, artifact_location=(root / "artifacts").as_uri())
    subject = {names.MODEL: "tiny", names.DATA: "aclsum"}
    parent = client.create_run(exp, tags={names.ROLE: "sweep", names.ALGORITHM: "HAEPO,GRPO,DPO", **subject})
    for (algorithm, lr), base in BASE.items():
        for seed in (0, 1):
            values = {"algorithm": algorithm, "seed": seed} | ({"lr": lr} if algorithm == "HAEPO" else {})
            run = client.create_run(exp, tags={
                names.PARENT_RUN: parent.info.run_id, names.ROLE: "trial", names.ALGORITHM: algorithm,
                names.SEED: str(seed), names.SEARCH_VALUES: json.dumps(values), **subject})
            run_id = run.info.run_id
            for key, value in {"algo": algorithm, "model": "tiny", "data": "aclsum", "lr": lr, "seed": seed,
                               "rl_updates": UPDATES, "ray_train/num_workers": 1}.items():
                client.log_param(run_id, key, value)
            _log(client, run_id, [_row(base, seed, u) for u in range(1, UPDATES + 1)], names.LLM_UPDATE)
            client.set_terminated(run_id)

    rl = client.create_experiment("rl-next-door", artifact_location=(root / "artifacts-rl").as_uri())
    rl_parent = client.create_run(rl, tags={names.ROLE: "sweep", names.ENV: "haepo/ChainMDP-v0"})
    rl_run = client.create_run(rl, tags={names.PARENT_RUN: rl_parent.info.run_id, names.ROLE: "trial",
                                         names.ALGORITHM: "PPO", names.ENV: "haepo/ChainMDP-v0",
                                         names.SEARCH_VALUES: json.dumps({"seed": 0})}).info.run_id
    _log(client, rl_run, [{names.TRAINING_ITERATION: i, names.EPISODE_RETURN_MEAN: 0.5 * i, names.TIME_TOTAL_S: 2.0 * i}
                          for i in (1, 2)], names.TRAINING_ITERATION)
    client.set_terminated(rl_run)
    return uri


@pytest.fixture(scope="module")
def llm_report(store, tmp_path_factory):
    """The report of the language-model experiment alone (built once: figures take seconds)."""
    return build_report(store, [EXPERIMENT], tmp_path_factory.mktemp("llm-report"))


def _expected(base: dict) -> dict[str, tuple[float, float]]:
    """Hand-computed (mean, std) over seeds 0 and 1 of a group's table columns."""
    final = SLOPE * UPDATES + SEED_STEP / 2  # the last update's values, seeds averaged
    seed_std = SEED_STEP / 2
    return {
        "reward": (base[names.LLM_REWARD] + final, seed_std),
        "reward sampled": (base[names.LLM_REWARD] + final - SAMPLED_SHIFT, seed_std),
        "ROUGE-L": (base[names.LLM_ROUGE_L] + final, seed_std),
        "semantic similarity": (OTHER[names.LLM_SEMANTIC_SIMILARITY] + final, seed_std),
        "profanity rate": (OTHER[names.LLM_PROFANITY_RATE] + final, seed_std),
        "completion length": (OTHER[names.LLM_COMPLETION_LENGTH] + final, seed_std),
        "KL exact": (OTHER[names.LLM_KL] + final, seed_std),
        # forward/backward is the highest phase, at the last update; seeds add 0 and 100 MB.
        "peak memory MB": (2.0 * base["memory"] + 10 * UPDATES + 50, 50),
        "s / update": (base["time"] + 0.25, 0.25),  # the same every update; seed 1 adds 0.5 s
    }


def test_llm_table_holds_the_papers_metrics_mean_and_std_over_seeds(llm_report):
    """Of the held-out evaluation: the training samples' values are TRAINING_SHIFT away."""
    report, out = llm_report, llm_report.out
    table = report.table
    assert table.columns[:7].tolist() == ["experiment", "algorithm", "model", "data", "config", "seeds", "updates"]
    got = {(r["algorithm"], r["config"]): r for _, r in table.iterrows()}
    assert set(got) == {("DPO", "default"), ("GRPO", "default"), ("HAEPO", "lr=1e-05"), ("HAEPO", "lr=5e-05")}
    for (algorithm, lr), base in BASE.items():
        row = got[(algorithm, f"lr={lr:.4g}" if algorithm == "HAEPO" else "default")]
        assert (row["model"], row["data"], row["seeds"], row["updates"]) == ("tiny", "aclsum", 2, UPDATES)
        for column, (mean, std) in _expected(base).items():
            assert row[f"{column} mean"] == pytest.approx(mean), (algorithm, column)
            assert row[f"{column} std"] == pytest.approx(std), (algorithm, column)
    assert not any(c.startswith("return") or c == "s / 100 updates" for c in table.columns)

    csv = pd.read_csv(out / "results.csv")
    assert csv["reward mean"].tolist() == pytest.approx(table["reward mean"].tolist())
    caption, markdown = (out / "results.md").read_text().split("\n\n")[:2]
    assert caption == LLM.caption and "held-out" in caption and "never the training samples" in caption
    assert markdown.count("\n") == len(table) + 1


def test_llm_curves_run_on_updates_and_training_seconds(llm_report):
    grpo = next(g for g in llm_report.groups if g.algorithm == "GRPO")
    assert LLM.curves["reward-vs-updates"][0] == names.llm_eval(names.LLM_REWARD)
    by_update = grpo.curve(names.llm_eval(names.LLM_REWARD), names.LLM_UPDATE)
    assert by_update.index.tolist() == [1, 2, 3]
    assert by_update["mean"].tolist() == pytest.approx([0.4 + SLOPE * u + SEED_STEP / 2 for u in (1, 2, 3)])
    assert by_update["std"].tolist() == pytest.approx([SEED_STEP / 2] * 3)
    by_time = grpo.curve(names.llm_eval(names.LLM_REWARD), names.LLM_TRAIN_TIME)
    assert by_time.index.max() == pytest.approx(SFT_S + UPDATES * 3.5)  # seed 1's last update


def test_llm_figures_are_written_and_shown_in_the_page(llm_report):
    report, out = llm_report, llm_report.out
    stems = {f.stem for f in report.figures}
    section = "tiny_on_aclsum"
    kinds_of_figure = ("reward-vs-updates", "reward-vs-seconds", "rouge-l-vs-updates", "rouge-l-vs-seconds",
                       "effective-trajectories-vs-updates", "peak-memory")
    assert stems == {f"{section}-{name}" for name in kinds_of_figure}
    assert {f.section for f in report.figures} == {"tiny on aclsum"}
    for stem in stems:
        assert (out / f"{stem}.png").stat().st_size > 1000
    svg = (out / f"{section}-reward-vs-updates.svg").read_text()
    assert all(f"{EXPERIMENT}: {a} (default, 2 seeds)" in svg for a in ("DPO", "GRPO"))
    assert f"{EXPERIMENT}: HAEPO (lr=1e-05, 2 seeds)" in svg
    n_eff = (out / f"{section}-effective-trajectories-vs-updates.svg").read_text()  # HAEPO's weights: HAEPO alone
    assert f"{EXPERIMENT}: HAEPO (lr=1e-05, 2 seeds)" in n_eff and "GRPO" not in n_eff and "DPO" not in n_eff
    memory = (out / f"{section}-peak-memory.svg").read_text()
    assert all(p in memory for p in ("generation", "reference", "forward/backward", "optimizer"))
    page = report.index.read_text()
    assert all(f.title in page for f in report.figures) and page.count('<div class="plot"') == 6
    assert (out / "plotly.min.js").stat().st_size > 1_000_000 and '<script src="plotly.min.js"' in page
    assert "ROUGE-L mean" in page and "peak memory MB mean" in page
    assert f'<p class="caption">{LLM.caption}</p>' in page


def test_llm_charts_hover_hide_and_highlight_offline_in_headless_chromium(llm_report):
    """The page with the network blocked: hovering a held-out reward curve (against updates and
    against seconds) and a peak-memory bar reads the configuration, the x and the value with
    its spread over seeds; a legend click hides a method; a drag zooms, a double click resets;
    the table sorts, filters, and a ticked row highlights its method's curves and bars."""
    report = llm_report
    section = "tiny_on_aclsum"
    grpo = next(g for g in report.groups if g.algorithm == "GRPO")
    label = f"{EXPERIMENT}: GRPO (default, 2 seeds)"
    reward = names.llm_eval(names.LLM_REWARD)
    with offline_page(report.index) as driver:
        assert_offline(driver, report.index)

        by_update = chart(driver, f"{section}-reward-vs-updates")
        lines = hover(driver, by_update, 2, 0.4 + 2 * SLOPE + SEED_STEP / 2)
        assert lines[:2] == [label, "update 2"]
        assert tooltip_value(lines, "held-out reward (greedy)") == (pytest.approx(0.7), pytest.approx(0.1), 2)

        curve = grpo.curve(reward, names.LLM_TRAIN_TIME)
        at, point = curve.index[120], curve.iloc[120]
        lines = hover(driver, chart(driver, f"{section}-reward-vs-seconds"), at, point["mean"])
        assert lines[:2] == [label, f"{at:.4g} s"]
        value, spread, seeds = tooltip_value(lines, "held-out reward (greedy)")
        assert (value, spread, seeds) == (pytest.approx(point["mean"], rel=1e-3), pytest.approx(point["std"], rel=1e-2),
                                          point["n"])

        memory = chart(driver, f"{section}-peak-memory")
        lines = hover_bar(driver, memory, label, 2)  # forward/backward: 2 x 1400 MB, + 10 MB an update, + 100 a seed
        assert lines[:2] == [label, "phase forward/backward"]
        assert tooltip_value(lines, "peak memory (MB)") == (2 * 1400 + 10 * UPDATES + 50, 50, 2)

        assert_legend_toggles(driver, by_update, label)
        assert_zoom_and_reset(driver, by_update)

        assert sort_by(driver, "results-0", "reward mean") == ["0.6", "0.75", "0.8", "0.9"]  # as numbers
        assert column(driver, "results-0", "config")[1] == "lr=1e-05"
        assert sort_by(driver, "results-0", "reward mean") == ["0.9", "0.8", "0.75", "0.6"]
        assert sort_by(driver, "results-0", "algorithm") == ["DPO", "GRPO", "HAEPO", "HAEPO"]
        filter_rows(driver, "results-0", "haepo 1e-05")
        assert column(driver, "results-0", "config") == ["lr=1e-05"]
        filter_rows(driver, "results-0", "")
        assert len(column(driver, "results-0", "config")) == 4

        tick_row(driver, "results-0", "algorithm", "GRPO")
        for plot in (by_update, memory):
            assert_highlighted(driver, plot, label)


def test_a_report_of_both_kinds_shows_a_table_each(store, tmp_path):
    """RL and language-model groups share results.csv; results.md and the page show a table
    per kind, each with its own columns, and the figures of both."""
    (tmp_path / "win_rates.csv").write_text("a previous report's\n")
    report = build_report(store, [EXPERIMENT, "rl-next-door"], tmp_path)
    assert (tmp_path / "llm_results.csv").is_file() and not (tmp_path / "win_rates.csv").exists()  # no generations
    table = report.table
    assert len(table) == 5
    rl = table[table["experiment"] == "rl-next-door"].iloc[0]
    assert (rl["algorithm"], rl["return mean"], rl["s / 100 updates"]) == ("PPO", 1.0, 200.0)
    assert np.isnan(rl["reward mean"]) and pd.isna(rl["model"])
    tables = (tmp_path / "results.md").read_text().split("\n\n")
    assert len(tables) == 11 and "return mean" in tables[0] and "reward mean" not in tables[0]
    assert tables[1] == LLM.caption and tables[9] == "Provenance (code, machine, libraries):"
    assert tables[3] == f"{RL_TITLE}:" and "rl-next-door" in tables[4] and "ROUGE" not in tables[4]
    assert tables[5] == f"{METHODS_TITLE}:"  # no generations here: no win rates, no verdicts
    assert tables[7] == f"{OPTIMISED_TITLE}:"
    assert "reward mean" in tables[2] and "return mean" not in tables[2]
    assert {f.section for f in report.figures} == {"tiny on aclsum", "haepo/ChainMDP-v0"}
    printed = to_text(table).split("\n\n")
    assert printed[1:] == [LLM.caption, printed[2]] and "s / 100 updates" in printed[0] and "ROUGE-L mean" in printed[2]

    page = check_page(report.index, ARTIFACTS / "report-llm.png")
    assert not page["errors"], page["errors"]
    assert page["plots"] == page["charts"] == len(report.figures) == 8  # the LM sweep's 6, RL vs updates, seconds
    assert page["image_widths"] == [] and page["table_rows"] == [1, 4]

    # The page copied without plotly.min.js says so and shows the PNGs instead.
    (tmp_path / "plotly.min.js").unlink()
    page = check_page(report.index, ARTIFACTS / "report-llm-no-plotly.png")
    assert len(page["errors"]) == 1 and "plotly.min.js" in page["errors"][0]["message"], page["errors"]
    assert page["charts"] == 0 and len(page["image_widths"]) == 8
    assert all(width and width > 100 for width in page["image_widths"]), page["image_widths"]


def test_a_trial_that_reported_nothing_is_listed_without_figures(tmp_path):
    """A language-model trial that failed before its first update has no curves: the table
    still lists it (0 updates), and no figure is drawn from it."""
    trial = Trial(EXPERIMENT, "r", "HAEPO", "?", 0, {}, {}, pd.DataFrame(), model="tiny", data="aclsum")
    groups = group_trials([trial])
    table = results_table(groups)
    assert table.values.tolist() == [[EXPERIMENT, "HAEPO", "tiny", "aclsum", "default", 1, 0]]
    assert write_figures(groups, tmp_path) == []


def test_a_beta_grid_of_an_llm_sweep_gets_a_heatmap_of_the_final_reward(tmp_path):
    """HAEPO on the tiny model over beta_ent x beta_kl (the issue's sweep path) gets the RL
    sweeps' heatmap, of the final held-out reward, named after its model and data set too."""
    def trial(beta_ent: float, beta_kl: float) -> Trial:
        curves = pd.DataFrame({names.llm_eval(names.LLM_REWARD): [0.0, beta_ent + beta_kl]},
                              index=pd.Index([1, 2], name=names.LLM_UPDATE))
        return Trial(EXPERIMENT, "r", "HAEPO", "?", 0, {"beta_ent": beta_ent, "beta_kl": beta_kl}, {}, curves,
                     model="tiny", data="aclsum")

    figures = write_figures(group_trials([trial(e, k) for e in (0.01, 0.1) for k in (0.0, 0.01)]), tmp_path)
    heatmap = next(f for f in figures if "heatmap" in f.stem)
    assert heatmap.stem == f"{EXPERIMENT}-HAEPO-tiny-aclsum-heatmap-betas"
    assert heatmap.title == f"{EXPERIMENT}, HAEPO: final held-out reward over beta_ent x beta_kl"
    svg = (tmp_path / f"{heatmap.stem}.svg").read_text()
    assert "final mean held-out reward" in svg and "0.11" in svg  # beta_ent=0.1, beta_kl=0.01
