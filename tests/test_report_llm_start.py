"""``haepo report`` on a language-model sweep with the SFT start's evaluation (``eval_start``) and
both DPOs: the SFT start as a method counted once per seed in every table and figure, which
method optimised each metric, and verdicts by the metrics neither of two methods optimised.

Runs as a sweep writes them (SQLite MLflow store): HAEPO, DPO (the paper's gold pairs) and DPO
on reward pairs, seeds 0 and 1, 4 updates, an evaluation after update 4; every trial of a seed
logs the same start evaluation (``eval_start/*`` at update 1: reward 0.2 + 0.1 seed) and its
greedy completions as update 0 of ``generations.jsonl``.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
from helpers import llm_sweep, llm_trial_run

from haepo_ray import names
from haepo_ray.report import build_report
from haepo_ray.report.aggregate import curve_groups
from haepo_ray.report.kinds import GREEDY_REWARD
from haepo_ray.report.optimised import NONE, OPTIMISED_TITLE, VERDICTS_TITLE
from haepo_ray.report.sft_start import SFT_START

EXPERIMENT = "llm-start"
UPDATES = 4
PROMPTS = ("p0", "p1")
# method -> (algorithm, its settings, held-out reward after update 4 at seed 0 (+0.1 per seed))
METHODS = {"HAEPO": ("HAEPO", {}, 0.5), "DPO": ("DPO", {}, 0.4),
           "DPO (dpo_pairs=reward)": ("DPO", {"dpo_pairs": "reward"}, 0.45)}
# per prompt, (reward, ROUGE-L, ROUGE-2) of a greedy completion: the start's, each method's last
START_SCORES = {"p0": (0.2, 0.1, 0.0), "p1": (0.3, 0.2, 0.1)}
FINAL_SCORES = {"HAEPO": {"p0": (0.6, 0.2, 0.1), "p1": (0.6, 0.1, 0.0)},
                "DPO": {"p0": (0.4, 0.3, 0.2), "p1": (0.4, 0.3, 0.2)},
                "DPO (dpo_pairs=reward)": {"p0": (0.5, 0.2, 0.1), "p1": (0.5, 0.2, 0.1)}}


def _metrics(final_reward: float, seed: int) -> list:
    from mlflow.entities import Metric

    start = 0.2 + 0.1 * seed
    rows = []
    for u in range(1, UPDATES + 1):
        row = {names.LLM_UPDATE: u, names.LLM_TRAIN_TIME: 10.0 * u, names.LLM_REWARD: 9.0}
        if u == 1:  # the SFT start's evaluation, before update 1
            row |= {names.llm_eval(names.LLM_REWARD, at=names.LLM_EVAL_START): start,
                    names.llm_eval(names.LLM_ROUGE_L, at=names.LLM_EVAL_START): start / 2}
        if u == UPDATES:
            row |= {names.llm_eval(names.LLM_REWARD): final_reward + 0.1 * seed,
                    names.llm_eval(names.LLM_ROUGE_L): 0.3}
        rows += [Metric(k, float(v), 0, u) for k, v in row.items()]
    return rows


def _generations(method: str, algorithm: str, seed: int) -> str:
    lines = []
    for update, scores in ((0, START_SCORES), (UPDATES, FINAL_SCORES[method])):
        lines += [json.dumps({"update": update, "prompt_id": p, "reference": "gold", "completion": "summary",
                              "reward": r, "semantic_similarity": r, "rouge_l": rl, "rouge_2": r2,
                              "algorithm": algorithm, "model": "tiny", "seed": seed})
                  for p, (r, rl, r2) in scores.items()]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("report-llm-start")
    uri, client, exp, parent, subject = llm_sweep(root, EXPERIMENT)
    for method, (algorithm, values, final_reward) in METHODS.items():
        for seed in (0, 1):
            llm_trial_run(client, exp, parent, root, algorithm=algorithm, settings=values, seed=seed, subject=subject,
                          metrics=_metrics(final_reward, seed), generations=_generations(method, algorithm, seed))
    return build_report(uri, [EXPERIMENT], root / "report")


def test_the_sft_start_is_a_method_counted_once_per_seed_in_every_table(report):
    table = report.table.set_index("algorithm")
    start = table.loc[SFT_START]
    assert (start["seeds"], start["updates"]) == (2, 0)  # 6 trials, 2 seeds: one start each
    assert start["reward mean"] == pytest.approx(0.25) and start["ROUGE-L mean"] == pytest.approx(0.125)
    methods = report.methods.set_index("method")
    cell = methods.loc[SFT_START, "reward final"]
    assert (cell.n, cell.mean) == (2, pytest.approx(0.25))
    assert methods.loc[SFT_START, "reward AUC"].mean == pytest.approx(0.25)  # not trained: a level line
    assert methods.loc["HAEPO", "reward final"].mean == pytest.approx(0.6)  # its prompts' last greedy rewards
    csv = pd.read_csv(report.out / "llm_results.csv").set_index("method")
    assert csv.loc[SFT_START, "reward final n"] == 2


def test_the_sft_start_is_in_the_win_rates_and_the_figures(report):
    rates = pd.read_csv(report.out / "win_rates.csv")
    got = {(r["judge"], r["method"], r["opponent"]): r["win rate mean"] for r in rates.to_dict("records")}
    # the start's greedy completions (update 0) against each method's last ones, per seed
    assert got[("reward", "HAEPO", SFT_START)] == 1.0 and got[("reward", SFT_START, "HAEPO")] == 0.0
    assert got[("ROUGE-L", "HAEPO", SFT_START)] == pytest.approx(0.5)  # p0 ahead, p1 behind
    assert got[("ROUGE-2", "DPO", SFT_START)] == 1.0
    (start,) = (g for g in report.groups if g.algorithm == SFT_START)
    assert start in curve_groups(report.groups)  # the groups the curves draw
    curve = start.curve(GREEDY_REWARD, names.LLM_UPDATE)
    assert curve.index.tolist() == [1.0, 2.0, 3.0, 4.0] and curve["mean"].tolist() == pytest.approx([0.25] * 4)
    for figure in report.figures:
        if "peak memory" not in figure.title and "n_eff" not in figure.title:
            assert f"{SFT_START} (default, 2 seeds)" in (report.out / f"{figure.stem}.svg").read_text(), figure


def test_each_metric_says_which_methods_optimised_it(report):
    table = report.optimised.set_index("metric or method")["optimised by / trained on"]
    assert table["reward"] == table["token F1"] == table["semantic similarity"] == "DPO (dpo_pairs=reward), HAEPO"
    assert table["ROUGE-L"] == table["ROUGE-2"] == NONE
    assert table["DPO"] == "the gold summary, preferred to its own samples"
    assert table["HAEPO"] == "the reward: 0.333 token F1 + 0.333 semantic similarity + 0.333 length closeness"
    assert table[SFT_START] == "the gold summaries' likelihood (SFT)"
    markdown = (report.out / "results.md").read_text()
    assert OPTIMISED_TITLE in markdown and VERDICTS_TITLE in markdown


def test_every_verdict_is_judged_by_a_metric_neither_method_optimised(report):
    rows = report.verdicts.set_index(["method", "opponent"])
    assert len(rows) == 4 * 3  # every ordered pair of the four methods
    for verdict in rows["verdict by metrics neither optimised"]:
        assert "ROUGE-L: " in verdict and "ROUGE-2: " in verdict
    haepo_dpo = rows.loc[("HAEPO", "DPO")]
    # the reward (HAEPO's) is no judge of HAEPO against DPO; the semantic similarity (also HAEPO's) neither
    assert "reward" not in haepo_dpo["verdict by metrics neither optimised"]
    assert haepo_dpo["win rate by metrics one optimised"].startswith("reward (optimised by HAEPO): 1 [")
    # the two DPOs against the SFT start: only DPO (gold) optimised none of the reward's parts
    assert "reward: ahead" in rows.loc[("DPO", SFT_START), "verdict by metrics neither optimised"]
    assert "reward (optimised by DPO (dpo_pairs=reward))" in rows.loc[("DPO (dpo_pairs=reward)", SFT_START),
                                                                     "win rate by metrics one optimised"]
    # both seeds win both prompts on ROUGE-2: an interval of zero width above 0.5
    assert "ROUGE-2: ahead (1 [1, 1])" in rows.loc[("DPO", SFT_START), "verdict by metrics neither optimised"]
    assert len(pd.read_csv(report.out / "verdicts.csv")) == 12
