"""``haepo report``'s language-model results with their uncertainty, end to end on a real SQLite
MLflow store: runs written as a language-model sweep writes them (tag ``haepo.model``, one step
per RL update, ``eval/*`` at the evaluated updates, ``generations.jsonl`` at the run's root),
with values chosen so that every mean, AUC and win rate is a sum by hand, and every interval
a Student-t by hand or the bootstrap of known per-prompt values.

Methods (experiment ``llm-results``, model ``tiny`` on ``aclsum``, 12 updates, evaluations at 4,
8 and 12): HAEPO and GRPO with seeds 0, 1, 2; HAEPO with ``length_normalize=True`` with seed 0
alone (one seed: no interval). The training samples' metrics, under the bare names, are
TRAINING_SHIFT higher: the report must never show them. The reward, semantic similarity and
ROUGE-2 have per-prompt values in the generations (bootstrap over seeds and prompts, from those values), and
so has GRPO's exact KL; ROUGE-L and the other methods' KL have none there (the Student-t over
seeds of the MLflow values, marked).
"""

from __future__ import annotations

import html
import json
import math

import pandas as pd
import pytest
from helpers import sqlite_store

from haepo_ray import names
from haepo_ray.cli import main
from haepo_ray.report import build_report
from haepo_ray.report.generations import final_scores
from haepo_ray.report.kinds import TAIL_STEPS
from haepo_ray.report.llm_results import METHODS_TITLE
from haepo_ray.report.stats import bootstrap_ci, wins

EXPERIMENT = "llm-results"
UPDATES, EVALUATIONS = 12, (4, 8, 12)
T_975_2 = 4.302653  # t_{0.975, 2}: three seeds
SEED_STEP = 0.1  # a seed s adds s * SEED_STEP to every held-out metric: over seeds 0, 1, 2, mean +0.1, s.d. 0.1
SHAPE = {4: 0.0, 8: 0.3, 12: 0.1}  # added at each evaluation: final +0.1, AUC (0 / 2 + 0.3 + 0.1 / 2) / 2 = +0.175
TRAINING_SHIFT = 100.0
# method -> (algorithm, search values but the seed, seeds, base of each held-out metric)
METHODS = {
    "HAEPO": ("HAEPO", {}, (0, 1, 2),
              {names.LLM_REWARD: 0.4, names.LLM_ROUGE_L: 0.2, names.LLM_SEMANTIC_SIMILARITY: 0.5, names.LLM_KL: 0.03}),
    "HAEPO (length_normalize=True)": ("HAEPO", {"length_normalize": True}, (0,),
                                      {names.LLM_REWARD: 0.5, names.LLM_ROUGE_L: 0.3, names.LLM_SEMANTIC_SIMILARITY: 0.6,
                                       names.LLM_KL: 0.02}),
    "GRPO": ("GRPO", {}, (0, 1, 2),
             {names.LLM_REWARD: 0.3, names.LLM_ROUGE_L: 0.1, names.LLM_SEMANTIC_SIMILARITY: 0.4, names.LLM_KL: 0.05}),
}
# The reward of each method's greedy completion of prompts p0..p3 at its last evaluation, per
# seed; its semantic similarity is 1 - reward (so that judge reverses every win), its ROUGE-2
# reward / 2 (in the generations alone: no Student-t to fall back on); the
# evaluation before scores 1 - these (the report must take the last one).
PROMPTS = ("p0", "p1", "p2", "p3")
FINAL_REWARD = {
    ("HAEPO", 0): (0.5, 0.5, 0.5, 0.5), ("HAEPO", 1): (0.5, 0.5, 0.5, 0.5), ("HAEPO", 2): (0.5, 0.5, 0.5, 0.5),
    ("GRPO", 0): (0.4, 0.5, 0.6, 0.4), ("GRPO", 1): (0.4, 0.4, 0.4, 0.4), ("GRPO", 2): (0.6, 0.6, 0.6, 0.6),
    ("HAEPO (length_normalize=True)", 0): (0.6, 0.6, 0.4, 0.5),
}


def _neff(seed: int, update: int) -> float:
    """HAEPO's n_eff at a training update: 4 before the last TAIL_STEPS updates, then 2 + seed."""
    return 4.0 if update <= UPDATES - TAIL_STEPS else 2.0 + seed


def _metrics(base: dict[str, float], seed: int) -> list:
    from mlflow.entities import Metric

    rows = []
    for u in range(1, UPDATES + 1):
        row = {names.LLM_UPDATE: u, names.LLM_EFFECTIVE_NUM_TRAJECTORIES: _neff(seed, u),
               **{k: v + TRAINING_SHIFT for k, v in base.items()}}
        if u in EVALUATIONS:
            held_out = {k: v + SEED_STEP * seed + SHAPE[u] for k, v in base.items()}
            row |= {names.llm_eval(k): v for k, v in held_out.items() if k != names.LLM_KL}
            row[names.llm_eval(names.LLM_EXACT_KL, names.LLM_EVAL_POLICY)] = held_out[names.LLM_KL]
        rows += [Metric(k, float(v), 0, u) for k, v in row.items()]
    return rows


def _prompt_kl(seed: int, prompt: str) -> float:
    """GRPO's exact KL of a prompt (GRPO's generations alone carry one): 0.1 x (seed + prompt number)."""
    return 0.1 * (seed + int(prompt[1:]))


def _generations(method: str, seed: int, algorithm: str) -> str:
    final = dict(zip(PROMPTS, FINAL_REWARD[(method, seed)]))
    lines = []
    for update, rewards in ((8, {p: 1 - r for p, r in final.items()}), (12, final)):
        lines += [json.dumps({"update": update, "prompt_id": p, "source": f"post {p}", "reference": "gold",
                              "completion": "summary", "reward": r, "semantic_similarity": 1 - r, "rouge_2": r / 2,
                              **({"kl_exact": _prompt_kl(seed, p)} if method == "GRPO" else {}),
                              "algorithm": algorithm, "model": "tiny", "seed": seed}) for p, r in rewards.items()]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("report-llm-results")
    uri = sqlite_store(root / "mlflow.db")
    client = MlflowClient(uri)
    exp = client.create_experiment(EXPERIMENT, artifact_location=(root / "artifacts").as_uri())
    subject = {names.MODEL: "tiny", names.DATA: "aclsum"}
    parent = client.create_run(exp, tags={names.ROLE: "sweep", **subject}).info.run_id
    for method, (algorithm, values, seeds, base) in METHODS.items():
        for seed in seeds:
            run_id = client.create_run(exp, tags={
                names.PARENT_RUN: parent, names.ROLE: "trial", names.ALGORITHM: algorithm, names.SEED: str(seed),
                # as a sweep writes them: a method with settings of its own as {"algo": .., setting: ..}
                names.SEARCH_VALUES: json.dumps({"algorithm": {"algo": algorithm, **values} if values else algorithm,
                                                 "seed": seed}), **subject}).info.run_id
            client.log_batch(run_id, metrics=_metrics(base, seed))
            folder = root / "files" / run_id
            folder.mkdir(parents=True)
            (folder / "generations.jsonl").write_text(_generations(method, seed, algorithm))
            client.log_artifact(run_id, str(folder / "generations.jsonl"))
            client.set_terminated(run_id)
    return uri


@pytest.fixture(scope="module")
def report(store, tmp_path_factory):
    return build_report(store, [EXPERIMENT], tmp_path_factory.mktemp("llm-results-report"))


def _three_seeds(mean: float, sd: float) -> tuple[float, float, float]:
    half = T_975_2 * sd / math.sqrt(3)
    return mean, mean - half, mean + half


def _prompt_rows(method: str, judge: str = "reward") -> list[list[float]]:
    """Per seed, the method's per-prompt final scores by ``judge`` (semantic similarity 1 - reward)."""
    rows = [list(FINAL_REWARD[(method, seed)]) for seed in METHODS[method][2]]
    return rows if judge == "reward" else [[1 - r for r in row] for row in rows]


def _expected(method: str) -> dict[str, tuple[float, float, float] | float]:
    """Column -> (mean, CI low, CI high) over seeds 0, 1, 2, or the value of one seed."""
    _, _, seeds, base = METHODS[method]
    seed_mean = SEED_STEP * sum(seeds) / len(seeds)
    by_seed = {"ROUGE-L": names.LLM_ROUGE_L}  # no per-prompt values: Student-t over seeds
    out = {}
    for column, key in by_seed.items():
        out[f"{column} final"] = base[key] + seed_mean + SHAPE[12]
        out[f"{column} AUC"] = base[key] + seed_mean + 0.175
    out["KL exact final"] = base[names.LLM_KL] + seed_mean + SHAPE[12]
    if len(seeds) == 1:
        out |= {"reward final": sum(FINAL_REWARD[(method, 0)]) / 4, "reward AUC": 0.5,
                "ROUGE-2 final": sum(FINAL_REWARD[(method, 0)]) / 8,
                "semantic similarity final": 1 - sum(FINAL_REWARD[(method, 0)]) / 4, "semantic similarity AUC": 0.5,
                f"n_eff last {TAIL_STEPS} updates": 2.0}
        return out
    out = {c: _three_seeds(v, SEED_STEP) for c, v in out.items()}
    # per prompt: the last evaluation's score, its AUC over updates 8 and 12 ((1 - r + r) / 2 = 0.5)
    for column, judge, bounds in (("reward", "reward", None), ("semantic similarity", "sim", (-1.0, 1.0))):
        rows = _prompt_rows(method, judge)
        got = bootstrap_ci(rows, **({"bounds": bounds} if bounds else {}))
        assert got.mean == pytest.approx(sum(map(sum, rows)) / 12)  # the mean of seed means, by hand
        out[f"{column} final"] = (got.mean, got.low, got.high)
        out[f"{column} AUC"] = (0.5, 0.5, 0.5)
    halves = bootstrap_ci([[r / 2 for r in row] for row in _prompt_rows(method)], bounds=(0.0, 1.0))
    out["ROUGE-2 final"] = (halves.mean, halves.low, halves.high)  # per prompt reward / 2: the bootstrap
    if method == "GRPO":  # per-prompt exact KLs: the bootstrap, cut at 0; mean 0.1 x (1 + 1.5) = 0.25
        kl = bootstrap_ci([[_prompt_kl(s, p) for p in PROMPTS] for s in seeds], bounds=(0.0, math.inf))
        assert kl.mean == pytest.approx(0.25) and kl.low >= 0
        out["KL exact final"] = (kl.mean, kl.low, kl.high)
    # n_eff: 2 + seed over each seed's last updates, resampled by seed and update
    neff = bootstrap_ci([[2.0 + s] * TAIL_STEPS for s in seeds], shared_units=False, bounds=(1.0, math.inf))
    out[f"n_eff last {TAIL_STEPS} updates"] = (3.0, neff.low, neff.high)
    return out


def test_each_method_has_mean_and_ci_over_seeds_of_the_held_out_results(report):
    rows = {r["method"]: r for r in report.methods.to_dict("records")}
    assert set(rows) == set(METHODS)
    for method in METHODS:
        row = rows[method]
        assert (row["model"], row["data"], row["seeds"]) == ("tiny", "aclsum", len(METHODS[method][2]))
        for column, value in _expected(method).items():
            cell = row[column]
            if column.startswith("n_eff") and method == "GRPO":  # HAEPO's weights: not a GRPO result
                assert cell.n == 0, cell
            elif isinstance(value, tuple):
                assert (cell.mean, cell.low, cell.high) == pytest.approx(value, abs=1e-6), (method, column)
                assert cell.n == 3
            else:
                assert cell.mean == pytest.approx(value) and cell.n == 1 and math.isnan(cell.low), (method, column)


def test_the_csv_holds_the_numbers_and_the_pages_the_intervals(report):
    csv = pd.read_csv(report.out / "llm_results.csv").set_index("method")
    mean, low, high = _three_seeds(0.2 + 0.1 + 0.175, SEED_STEP)
    assert csv.loc["HAEPO", ["ROUGE-L AUC mean", "ROUGE-L AUC CI low", "ROUGE-L AUC CI high", "ROUGE-L AUC n"]
                   ].tolist() == pytest.approx([mean, low, high, 3], abs=1e-6)
    assert math.isnan(csv.loc["GRPO", f"n_eff last {TAIL_STEPS} updates mean"])
    assert (csv.loc["HAEPO", "ROUGE-L AUC CI by"], csv.loc["HAEPO", "reward AUC CI by"]) == ("t", "bootstrap")
    # 0.4 = 0.3 + seed 0 + SHAPE[12]; 0.475 = 0.2 + 0.1 + 0.175 +- 4.303 * 0.1 / sqrt(3), Student-t: marked
    grpo = bootstrap_ci(_prompt_rows("GRPO"))
    markdown, page = (report.out / "results.md").read_text(), report.index.read_text()
    for text, title in ((markdown, METHODS_TITLE), (page, html.escape(METHODS_TITLE))):
        assert title in text
        assert "0.4 (n=1, no interval)" in text and "0.475 [0.2266, 0.7234] (seed t)" in text
        assert f"{grpo.mean:.4g} [{grpo.low:.4g}, {grpo.high:.4g}]" in text
        assert f"{grpo.high:.4g}] (seed t)" not in text


def _win_rows(ours: str, theirs: str, judge: str = "reward") -> list:
    return [wins(a, b) for a, b in zip(_prompt_rows(ours, judge), _prompt_rows(theirs, judge))]


def test_win_rates_per_prompt_and_seed_by_each_judge(report):
    """HAEPO against GRPO by the reward, per seed: (1 + 0.5 + 0 + 1) / 4, 1, 0 (ties half), so
    13/24, and the same by ROUGE-2 (reward / 2); by semantic similarity (1 - reward) every win reversed. The intervals: the bootstrap
    over those seeds and prompts, cut to [0, 1] (the seed-t one was [-0.7133, 1.797])."""
    rates = pd.read_csv(report.out / "win_rates.csv")
    got = {(r["judge"], r["method"], r["opponent"]): (r["win rate mean"], r["win rate CI low"], r["win rate CI high"],
                                                      r["win rate n"]) for r in rates.to_dict("records")}
    for judge, ours, theirs, mean in (("reward", "HAEPO", "GRPO", 13 / 24), ("reward", "GRPO", "HAEPO", 11 / 24),
                                      ("semantic similarity", "HAEPO", "GRPO", 11 / 24),
                                      ("ROUGE-2", "HAEPO", "GRPO", 13 / 24)):  # reward / 2: the reward's wins
        expected = bootstrap_ci(_win_rows(ours, theirs, "sim" if judge == "semantic similarity" else "reward"),
                                bounds=(0, 1))
        assert got[(judge, ours, theirs)] == pytest.approx((mean, expected.low, expected.high, 3), abs=1e-6)
        assert 0 <= expected.low < mean < expected.high <= 1
    # One common seed (0): 1, 1, 0, 0.5 against HAEPO; 1, 1, 0, 1 against GRPO; no interval.
    ln = "HAEPO (length_normalize=True)"
    assert got[("reward", ln, "HAEPO")][::3] == pytest.approx((0.625, 1))
    assert got[("reward", ln, "GRPO")][::3] == pytest.approx((0.75, 1))
    assert math.isnan(got[("reward", ln, "GRPO")][1])
    assert len(got) == 3 * 6  # three judges (no per-prompt ROUGE-L), every ordered pair of the methods

    matrices = {title: t for title, t in report.extras if title.startswith("Win rate")}
    (by_reward,) = (t for title, t in matrices.items() if "judged by the reward" in title)
    cell = by_reward.set_index("method").loc["HAEPO", "GRPO"]
    expected = bootstrap_ci(_win_rows("HAEPO", "GRPO"), bounds=(0, 1))
    assert cell == f"0.5417 [{expected.low:.4g}, {expected.high:.4g}]"
    assert by_reward.set_index("method").loc[ln, "GRPO"] == "0.75 (n=1, no interval)"
    assert by_reward.set_index("method").loc["HAEPO", "HAEPO"] == ""
    assert len(matrices) == 3 and all("tiny on aclsum" in title for title in matrices)


def test_haepo_report_prints_the_methods_and_win_rates(store, tmp_path, capsys):
    assert main(["report", "--experiment", EXPERIMENT, "--tracking-uri", store, "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert METHODS_TITLE in printed and "judged by the semantic similarity" in printed
    assert "0.5417 [" in printed and "0.5417 [-0.7133, 1.797]" not in printed
    assert (tmp_path / "win_rates.csv").is_file() and (tmp_path / "llm_results.csv").is_file()



def test_final_scores_keep_the_last_evaluation_and_name_a_bad_line():
    """Per prompt, the numbers of the file's last update (not its update or seed, nor a text)
    and their area over the prompt's updates; a judge's score a record lacks is NaN."""
    lines = [json.dumps({"update": 4, "prompt_id": "a", "reward": 0.1, "semantic_similarity": 0.2}), "",
             json.dumps({"update": 8, "prompt_id": "a", "reward": 0.3, "seed": 1, "completion": "x"}),
             json.dumps({"update": 8, "prompt_id": "b", "reward": 0.5, "semantic_similarity": 0.6, "kl_exact": 2})]
    got = final_scores(lines, "generations")
    assert set(got) == {"a", "b"} and set(got["b"]) == {"reward", "semantic_similarity", "kl_exact", "reward AUC",
                                                        "semantic_similarity AUC", "kl_exact AUC"}
    assert (got["b"]["reward"], got["b"]["semantic_similarity"], got["b"]["kl_exact"]) == (0.5, 0.6, 2.0)
    assert math.isnan(got["b"]["reward AUC"])  # one update: no area
    assert got["a"]["reward"] == 0.3 and math.isnan(got["a"]["semantic_similarity"])
    assert got["a"]["reward AUC"] == pytest.approx(0.2) and math.isnan(got["a"]["semantic_similarity AUC"])
    with pytest.raises(ValueError, match="generations line 2: expected an object with 'update'"):
        final_scores([lines[0], json.dumps({"prompt_id": "a"})], "generations")
