"""``haepo report`` on a real SQLite MLflow store filled by a small real sweep.

The sweep: HAEPO on a 5-armed Gaussian bandit, lr x batch size x 2 seeds (8 trials), so the
report has four configurations of two seeds each, regret curves and an lr x batch heatmap; RLlib
evaluates every second iteration, so it has the evaluation runs' return too.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from chromium import (assert_highlighted, assert_legend_toggles, assert_offline, chart, column, filter_rows, hover,
                      offline_page, sort_by, tick_row, tooltip_value)
from helpers import free_port, sqlite_store

from haepo_ray import cli
from haepo_ray.names import EVAL_EPISODE_RETURN_MEAN as EVAL_RETURN
from haepo_ray.report import build_report
from haepo_ray.report.aggregate import Group, group_trials
from haepo_ray.report.figures import curve_figure, write_figures
from haepo_ray.report.interval_cells import interval_text
from haepo_ray.report.rl_results import RL_TITLE, rl_table
from haepo_ray.report.runs import ITERATION, REGRET, RETURN, SECONDS, Trial
from haepo_ray.sweep.kinds import parse_plan
from haepo_ray.sweep.runner import run_sweep

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("HAEPO_TEST_ARTIFACTS", REPO / ".haepo" / "test-artifacts"))
SPEC = {
    "name": "report-bandit",
    "algorithm": "HAEPO",
    "env": "haepo/GaussianBandit-v0",
    "env_config": {"num_arms": 5, "means_seed": 3},
    "settings": {"num_env_runners": 0, "model_config": {"fcnet_hiddens": [8]},
                 "evaluation_interval": 2, "evaluation_duration": 4, "evaluation_duration_unit": "episodes"},
    "search_space": {
        "lr": {"grid": [0.01, 0.1]},
        "batch_size": {"grid": [4, 8]},
        "seed": {"grid": [0, 1]},
    },
    "stop": {"iterations": 5},
    "resources": {"cpus": 1},
    "max_concurrent_trials": 2,
    "checkpoint_at_end": False,
    "tracking": {"log_checkpoints": False},
}


@pytest.fixture(scope="module")
def store(ray_session, tmp_path_factory):
    """(tracking URI, sweep result) of the bandit sweep above."""
    root = tmp_path_factory.mktemp("report")
    uri = sqlite_store(root / "mlflow.db")
    result = run_sweep(parse_plan(SPEC, "report-bandit.yaml"), tracking_uri=uri,
                       storage_path=str(root / "ray"), verbose=0, out=io.StringIO())
    assert len(result.trials) == 8 and all(t.status == "TERMINATED" for t in result.trials)
    return uri, result


def test_report_holds_the_aggregates_of_the_runs(store, tmp_path):
    from mlflow.tracking import MlflowClient

    uri, result = store
    report = build_report(uri, ["report-bandit"], tmp_path)
    table = report.table
    assert len(table) == 4 and set(table["seeds"]) == {2}
    assert set(table["config"]) == {f"batch_size={b}, lr={lr}" for b in (4, 8) for lr in (0.01, 0.1)}

    # Each group's mean and std of the final return and regret are those of its two runs.
    client = MlflowClient(uri)
    for _, row in table.iterrows():
        runs = [t for t in result.trials
                if row["config"] == f"batch_size={t.values['batch_size']}, lr={t.values['lr']}"]
        assert len(runs) == 2
        metrics = [client.get_run(t.run_id).data.metrics for t in runs]
        returns = [m[RETURN] for m in metrics]
        assert row["return mean"] == pytest.approx(np.mean(returns))
        assert row["return std"] == pytest.approx(np.std(returns))
        assert row["regret/step mean"] == pytest.approx(np.mean([m[REGRET] for m in metrics]))
        # Evaluated at iterations 2 and 4 only (not carried to the others), the last one in the table.
        evaluations = [client.get_metric_history(t.run_id, EVAL_RETURN) for t in runs]
        assert [sorted(h.step for h in history) for history in evaluations] == [[2, 4], [2, 4]]
        assert row["evaluation return mean"] == pytest.approx(np.mean([m[EVAL_RETURN] for m in metrics]))
        per_100 = np.mean([100 * m[SECONDS] / m["training_iteration"] for m in metrics])
        assert row["s / 100 updates"] == pytest.approx(per_100)

    # The files hold the same table, and every figure exists as PNG and SVG.
    assert pd.read_csv(tmp_path / "results.csv")["return mean"].tolist() == pytest.approx(table["return mean"].tolist())
    assert (tmp_path / "results.md").read_text().split("\n\n")[0].count("\n") == len(table) + 1
    stems = {f.stem for f in report.figures}
    env = "haepo_GaussianBandit-v0_means_seed=3_num_arms=5"
    assert stems == {f"{env}-return-vs-updates", f"{env}-return-vs-seconds", f"{env}-evaluation-return-vs-updates",
                     f"{env}-regret", f"{env}-entropy", "report-bandit-HAEPO-heatmap-lr-batch"}
    assert {f.section for f in report.figures} == {"haepo/GaussianBandit-v0 (means_seed=3, num_arms=5)"}
    for stem in stems:
        assert (tmp_path / f"{stem}.png").stat().st_size > 1000
        assert (tmp_path / f"{stem}.svg").read_text().lstrip().startswith("<?xml")


def test_rl_results_give_each_configuration_a_student_t_interval_over_its_seeds(store, tmp_path):
    """rl_results.csv: per configuration, the mean of its two seeds' final return, return AUC and
    final evaluation return, each with mean +- t(0.975, 1) s / sqrt(2), from the runs' MLflow rows;
    results.md shows the same table as text, and the bandit's columns without values are left out."""
    from mlflow.tracking import MlflowClient

    uri, result = store
    build_report(uri, ["report-bandit"], tmp_path)
    client = MlflowClient(uri)
    rl = pd.read_csv(tmp_path / "rl_results.csv")
    assert len(rl) == 4 and set(rl["seeds"]) == {2}
    assert set(rl["env"]) == {"haepo/GaussianBandit-v0 (means_seed=3, num_arms=5)"}
    assert not any(c.startswith("success final") for c in rl)  # the bandit reports no success
    t_975_1 = 12.706204736174705  # Student's t, 97.5% quantile, one degree of freedom

    def auc(history) -> float:
        steps, values = zip(*sorted((m.step, m.value) for m in history))
        return float(np.trapezoid(values, steps) / (steps[-1] - steps[0]))

    for _, row in rl.iterrows():
        runs = [t for t in result.trials
                if row["method"] == f"HAEPO (batch_size={t.values['batch_size']}, lr={t.values['lr']})"]
        assert len(runs) == 2
        histories = {key: [client.get_metric_history(t.run_id, key) for t in runs] for key in (RETURN, EVAL_RETURN)}
        for column, values in (("return final", [h[-1].value for h in histories[RETURN]]),
                               ("return AUC", [auc(h) for h in histories[RETURN]]),
                               ("evaluation return final", [h[-1].value for h in histories[EVAL_RETURN]])):
            half = t_975_1 * np.std(values, ddof=1) / np.sqrt(2)
            got = [row[f"{column} {part}"] for part in ("mean", "CI low", "CI high", "n", "CI by")]
            assert got == [pytest.approx(np.mean(values)), pytest.approx(np.mean(values) - half),
                           pytest.approx(np.mean(values) + half), 2, "t"], column
    text = (tmp_path / "results.md").read_text().split(RL_TITLE + ":\n\n", 1)[1].split("\n\n")[0]
    assert text.count("\n") == 1 + len(rl) and " [" in text and "(seed t)" not in text


def test_one_seed_has_no_interval_and_three_have_the_t_interval():
    groups = group_trials([_trial([1, 2], [0.0, r], [1.0, 2.0], config={"lr": lr})
                           for lr, finals in ((0.1, (1.0, 2.0, 3.0)), (0.2, (5.0,))) for r in finals])
    three, one = rl_table(groups).itertuples(index=False)
    assert (three.method, three.seeds, one.method, one.seeds) == ("HAEPO (lr=0.1)", 3, "HAEPO (lr=0.2)", 1)
    half = 4.302652729911275 / np.sqrt(3)  # t(0.975, 2) * s / sqrt(3), s = 1
    assert (three[4].mean, three[4].low, three[4].high) == pytest.approx((2.0, 2.0 - half, 2.0 + half))
    assert one[4].mean == 5.0 and np.isnan(one[4].low) and interval_text(one[4]) == "5 (n=1, no interval)"
    assert list(rl_table(groups)) == ["experiment", "env", "method", "seeds", "return final", "return AUC"]


def _trial(steps: list[int], returns: list[float], seconds: list[float], *, experiment: str = "e",
           algorithm: str = "HAEPO", config: dict | None = None, evaluations: list[float] | None = None) -> Trial:
    curves = pd.DataFrame({RETURN: returns, SECONDS: seconds}, index=pd.Index(steps, name=ITERATION))
    if evaluations is not None:
        curves[EVAL_RETURN] = evaluations
    params = {"env_config/length": "5"}
    return Trial(experiment, "r", algorithm, "haepo/ChainMDP-v0", 0, config or {}, params, curves)


def test_curves_are_interpolated_onto_a_common_grid_by_hand():
    # A: iterations 1..4, returns 0,1,2,3. B stopped early: iterations 1..2, returns 2,4
    # (held at 4 afterwards). Mean: (0+2)/2, (1+4)/2, (2+4)/2, (3+4)/2; std: half the gaps.
    group = Group("e", "HAEPO", "default", [
        _trial([1, 2, 3, 4], [0, 1, 2, 3], [1.0, 2.0, 3.0, 4.0]),
        _trial([1, 2], [2, 4], [2.0, 4.0]),
    ])
    curve = group.curve(RETURN)
    assert curve.index.tolist() == [1, 2, 3, 4]
    assert curve["mean"].tolist() == [1.0, 2.5, 3.0, 3.5]
    assert curve["std"].tolist() == [1.0, 1.5, 1.0, 0.5]
    # Against seconds, on 0..4 s: at 3 s A is at 2 and B (4 at 4 s, 2 at 2 s) at 3.
    by_time = group.curve(RETURN, SECONDS, points=5)
    assert by_time.index.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert by_time.loc[3.0, "mean"] == pytest.approx(2.5)
    # No curve starts before its first point: at 0 s no trial has reported, at 1 s only A has.
    assert by_time["n"].tolist()[:2] == [0, 1] and by_time.loc[1.0, "mean"] == 0.0
    assert group.seconds_per_100_updates().tolist() == [100.0, 200.0]


def test_a_curve_first_reported_late_has_no_value_before(tmp_path):
    # A held-out evaluation made after updates 3 and 4 only: nothing at updates 1 and 2, and
    # its figure still counts the seed that draws it.
    group = Group("e", "HAEPO", "default", [_trial([3, 4], [0.5, 0.7], [3.0, 4.0])])
    curve = group.curve(RETURN)
    assert curve["n"].tolist() == [0, 0, 1, 1]
    assert curve["mean"].tolist()[2:] == [0.5, 0.7] and curve["mean"].isna().tolist()[:2] == [True, True]
    assert curve_figure([group], RETURN, ITERATION, "return", "late", tmp_path, "late")
    assert "e: HAEPO (default, 1 seeds)" in (tmp_path / "late.svg").read_text()


def test_sweeps_on_one_env_share_its_figures(tmp_path):
    """Three sweeps on one env share its figures: a HAEPO grid of 5 learning rates draws its
    best (lr=0.8, final return 0.9); a 2-configuration sweep (zscore vs sum) draws both; and
    a PPO sweep its one."""
    trials = [
        _trial([1, 2], [0.1, 0.1 + lr], [1.0, 2.0], experiment="chain-haepo", config={"lr": lr})
        for lr in (0.1, 0.2, 0.3, 0.4, 0.8)
    ] + [
        _trial([1, 2], [0.2, 0.3], [1.0, 2.0], experiment="chain-norm", config={"norm": "sum"}),
        _trial([1, 2], [0.2, 0.5], [1.0, 2.0], experiment="chain-norm", config={"norm": "zscore"}),
        _trial([1, 2], [0.3, 0.4], [1.0, 2.0], experiment="chain-ppo", algorithm="PPO"),
    ]
    figures = write_figures(group_trials(trials), tmp_path)
    assert {f.section for f in figures} == {"haepo/ChainMDP-v0 (length=5)"}
    svg = (tmp_path / "haepo_ChainMDP-v0_length=5-return-vs-updates.svg").read_text()
    assert "chain-haepo: HAEPO (lr=0.8, 1 seeds)" in svg
    assert not any(f"lr={lr}," in svg for lr in (0.1, 0.2, 0.3, 0.4))
    assert "chain-norm: HAEPO (norm=sum, 1 seeds)" in svg and "chain-norm: HAEPO (norm=zscore, 1 seeds)" in svg
    assert "chain-ppo: PPO (default, 1 seeds)" in svg


def test_a_grid_whose_every_configuration_evaluated_is_ranked_by_its_evaluation_return(tmp_path):
    """A 6-configuration lr x batch grid: training return ranks lr=0.8 first, evaluation return
    lr=0.1; the curves draw lr=0.1 and the heatmap maps evaluation return. With one configuration
    unevaluated, training return ranks and fills the heatmap again."""
    def grid(evaluated) -> list[Trial]:
        return [_trial([1, 2], [0.1, lr], [1.0, 2.0], experiment="chain-grid", config={"lr": lr, "batch_size": b},
                       evaluations=[np.nan, 1.0 - lr] if evaluated(lr, b) else None)
                for lr in (0.1, 0.4, 0.8) for b in (4, 8)]

    curves = "haepo_ChainMDP-v0_length=5-return-vs-updates.svg"
    for out, evaluated, best, label, rows in (
            (tmp_path / "all", lambda lr, b: True, 0.1, "evaluation return", [0.9, 0.6, 0.2]),
            (tmp_path / "some", lambda lr, b: (lr, b) != (0.4, 8), 0.8, "return", [0.1, 0.4, 0.8])):
        figures = write_figures(group_trials(grid(evaluated)), out)
        svg = (out / curves).read_text()
        assert [lr for lr in (0.1, 0.4, 0.8) if f"lr={lr}, 1 seeds" in svg] == [best], out
        (heatmap,) = (f for f in figures if "heatmap" in f.stem)
        assert heatmap.title == f"chain-grid, HAEPO: final {label} over lr x episodes_per_batch"
        assert f"final mean {label}" in (out / f"{heatmap.stem}.svg").read_text()
        cells = heatmap.chart.data[0].z.ravel().tolist()  # rows lr 0.1, 0.4, 0.8; columns batch 4, 8
        assert cells == pytest.approx([v for v in rows for _ in (4, 8)])


def test_cli_prints_the_table_and_names_bad_input(store, tmp_path, capsys):
    uri, _ = store
    assert cli.main(["report", "--tracking-uri", uri, "--experiment", "report-bandit", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "return mean" in out and "batch_size=8, lr=0.1" in out and "index.html" in out

    assert cli.main(["report", "--tracking-uri", uri, "--experiment", "nope", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no MLflow experiment 'nope'" in err and "report-bandit" in err
    (tmp_path / "a-file").write_text("")
    for out in ("a-file", "a-file/report"):
        assert cli.main(["report", "--tracking-uri", uri, "--out", str(tmp_path / out)]) == 2
        assert f"--out {tmp_path / out}: {tmp_path / 'a-file'} is a file, not a folder" in capsys.readouterr().err
    missing = f"sqlite:///{tmp_path / 'missing.db'}"
    assert cli.main(["report", "--tracking-uri", missing, "--out", str(tmp_path)]) == 2
    assert "no MLflow store at" in capsys.readouterr().err
    assert not (tmp_path / "missing.db").exists()
    # a server that is down: said at once (MLflow's own client retries for about 4 minutes)
    down = f"http://127.0.0.1:{free_port()}"
    assert cli.main(["report", "--tracking-uri", down, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"haepo report: error: MLflow at {down} does not answer (" in err and "Connection refused" in err, err


def test_a_store_of_haepo_train_runs_says_they_are_not_sweep_trials(tmp_path, capsys):
    """A store that holds only runs of ``haepo train`` (as MLflowRun logs them): the report
    says it found no sweep trials and what the store holds instead."""
    from haepo_ray.tracking import MLflowRun

    uri = sqlite_store(tmp_path / "mlflow.db")
    for seed in (0, 1):
        run = MLflowRun(uri, "train", f"HAEPO-{seed}")
        assert run.start({"haepo.seed": str(seed)}, {"lr": 0.01}) is not None
        run.log_result({"training_iteration": 1, "env_runners": {"episode_return_mean": 0.5}})
        run.end("FINISHED")
    note = "it holds 2 runs of haepo train, which are not sweep trials: the report compares the trials of sweeps"
    for args, said in (([], f"no sweep trials found at {uri}; "),
                       (["--experiment", "train"], f"MLflow experiment 'train' at {uri} holds no sweep trials; ")):
        assert cli.main(["report", "--tracking-uri", uri, "--out", str(tmp_path / "out"), *args]) == 2
        assert said + note in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_search_values_of_older_stores_keep_their_names(tmp_path):
    """Sweeps now tag a trial's search values by their spec names; older ones tagged Tune's
    config paths, which still read as the setting's name."""
    import json

    from mlflow.tracking import MlflowClient

    from haepo_ray.report.runs import load_trials

    uri = sqlite_store(tmp_path / "old.db")
    client = MlflowClient(uri)
    exp = client.create_experiment("old", artifact_location=(tmp_path / "artifacts").as_uri())
    parent = client.create_run(exp, tags={"haepo.role": "sweep"}).info.run_id
    for values in ({"config/lr": 0.1, "_train_batch_size_per_learner": 8, "seed": 3},
                   {"lr": 0.1, "batch_size": 8, "seed": 4}):
        client.create_run(exp, tags={"mlflow.parentRunId": parent, "haepo.role": "trial",
                                     "haepo.algorithm": "PPO", "haepo.search_values": json.dumps(values)})
    trials = sorted(load_trials(uri, ["old"]), key=lambda t: t.seed)
    assert [(t.seed, t.config) for t in trials] == [
        (3, {"lr": 0.1, "train_batch_size_per_learner": 8}), (4, {"lr": 0.1, "batch_size": 8})]


def _status_store(tmp_path) -> str:
    """A store whose sweep has three finished seeds of one configuration (returns 1, 2, 3 at
    step 4) and three that did not finish: one failed at step 2 (its error tagged), one
    killed at step 3, one still running at step 1; each returns its seed at every step."""
    import json

    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    uri = sqlite_store(tmp_path / "status.db")
    client = MlflowClient(uri)
    exp = client.create_experiment("status", artifact_location=(tmp_path / "artifacts").as_uri())
    parent = client.create_run(exp, tags={"haepo.role": "sweep"}).info.run_id
    for seed, status, steps in ((1, "FINISHED", 4), (2, "FINISHED", 4), (3, "FINISHED", 4),
                                (10, "FAILED", 2), (20, "KILLED", 3), (30, "RUNNING", 1)):
        tags = {"mlflow.parentRunId": parent, "haepo.role": "trial", "haepo.algorithm": "HAEPO",
                "haepo.env": "haepo/ChainMDP-v0", "haepo.search_values": json.dumps({"lr": 0.1, "seed": seed})}
        if status == "FAILED":
            tags["haepo.error"] = "Traceback (most recent call last):\n  ...\nRuntimeError: injected\n"
        run = client.create_run(exp, tags=tags).info.run_id
        client.log_batch(run, metrics=[Metric(key, value, 0, step) for step in range(1, steps + 1)
                                       for key, value in ((RETURN, float(seed)), (SECONDS, float(step)))])
        if status != "RUNNING":
            client.set_terminated(run, status)
    return uri


def test_trials_that_did_not_finish_are_listed_apart_and_left_out(tmp_path, capsys):
    """Finished trials make the means, the seeds column and the curves; a failed, a killed
    and a running trial are listed with their status, last step and error, and enter the
    aggregates only with --include-unfinished, their curves ending where their runs ended."""
    uri = _status_store(tmp_path)
    report = build_report(uri, ["status"], tmp_path / "finished")
    (row,) = report.table.to_dict("records")
    assert (row["seeds"], row["return mean"]) == (3, pytest.approx(2.0)) and "unfinished" not in row
    assert report.groups[0].curve(RETURN)["n"].tolist() == [3, 3, 3, 3]
    listed = report.unfinished.set_index("seed")
    assert listed["status"].to_dict() == {10: "FAILED", 20: "KILLED", 30: "RUNNING"}
    assert listed["last step"].to_dict() == {10: 2, 20: 3, 30: 1}
    assert listed.loc[10, "error"] == "RuntimeError: injected"
    assert len(pd.read_csv(tmp_path / "finished" / "unfinished.csv")) == 3
    md = (tmp_path / "finished" / "results.md").read_text()
    assert "3 trials did not finish (left out of the aggregates)" in md and "RuntimeError: injected" in md
    assert "did not finish" in (tmp_path / "finished" / "index.html").read_text()

    assert cli.main(["report", "--tracking-uri", uri, "--experiment", "status", "--out", str(tmp_path / "all"),
                     "--include-unfinished"]) == 0
    assert "3 trials did not finish (included in the aggregates)" in capsys.readouterr().out
    everything = build_report(uri, ["status"], tmp_path / "all", include_unfinished=True)
    (row,) = everything.table.to_dict("records")
    assert (row["seeds"], row["unfinished"]) == (6, 3)
    assert row["return mean"] == pytest.approx((1 + 2 + 3 + 10 + 20 + 30) / 6)
    curve = everything.groups[0].curve(RETURN)
    assert curve["n"].tolist() == [6, 5, 4, 3]  # each unfinished run ends where it ended
    assert curve["mean"].tolist() == pytest.approx([66 / 6, 36 / 5, 26 / 4, 2.0])


def test_a_sweep_with_no_finished_trial_says_how_to_report_it(tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    uri = _status_store(tmp_path)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("status").experiment_id
    for run in client.search_runs([experiment], "attributes.status = 'FINISHED' and tags.`haepo.role` = 'trial'"):
        client.set_terminated(run.info.run_id, "KILLED")
    assert cli.main(["report", "--tracking-uri", uri, "--experiment", "status", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no trial of these sweeps finished (4 KILLED, 1 FAILED, 1 RUNNING)" in err and "--include-unfinished" in err


def _repeated_store(tmp_path) -> str:
    """A store whose experiment holds two sweeps, the second started a minute after the first
    and with beta_kl 0.1 where the first had its default: lr=0.1 with seeds 1, 2 (returns 11,
    12), then seeds 2, 3 (returns 2, 3); and lr=0.2 unseeded (seed tag ``None``) in each,
    returns 5 then 7."""
    import json

    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    uri = sqlite_store(tmp_path / "again.db")
    client = MlflowClient(uri)
    exp = client.create_experiment("again", artifact_location=(tmp_path / "artifacts").as_uri())
    for sweep, started, trials in (("again-1", 1_000_000, ((0.1, 1, 11.0), (0.1, 2, 12.0), (0.2, None, 5.0))),
                                   ("again-2", 1_060_000, ((0.1, 2, 2.0), (0.1, 3, 3.0), (0.2, None, 7.0)))):
        parent = client.create_run(exp, start_time=started, tags={"haepo.role": "sweep"}).info.run_id
        for i, (lr, seed, value) in enumerate(trials):
            values = {"lr": lr} if seed is None else {"lr": lr, "seed": seed}
            tags = {"mlflow.parentRunId": parent, "haepo.role": "trial", "haepo.algorithm": "HAEPO",
                    "haepo.env": "haepo/ChainMDP-v0", "haepo.sweep": sweep, "haepo.seed": str(seed),
                    "haepo.search_values": json.dumps(values)}
            run = client.create_run(exp, start_time=started + 1 + i, tags=tags).info.run_id
            params = [Param("lr", str(lr))] + ([Param("beta_kl", "0.1")] if sweep == "again-2" else [])
            client.log_batch(run, metrics=[Metric(RETURN, value, 0, 1), Metric(SECONDS, 1.0, 0, 1)], params=params)
            client.set_terminated(run, "FINISHED")
    return uri


def test_a_seed_repeated_by_a_newer_sweep_counts_once(tmp_path, capsys):
    """A sweep run again into its experiment: a configuration's seed counts once, with its
    newest trial's value; the older trial is listed apart as a repeat. Unseeded trials are
    samples of their own. Seeds aggregated with different settings are warned of. A later
    report without repeats leaves no repeats.csv behind."""
    uri = _repeated_store(tmp_path)
    report = build_report(uri, ["again"], tmp_path / "out")
    assert report.warnings == [
        "experiment 'again': the seeds of 2 of its configurations ran with different settings (beta_kl: (default), "
        "0.1), from sweeps of different specs; give each spec its own experiment (haepo sweep --experiment NAME)"]
    rows = report.table.set_index("config").to_dict("index")
    assert (rows["lr=0.1"]["seeds"], rows["lr=0.1"]["return mean"]) == (3, pytest.approx((11 + 2 + 3) / 3))
    assert (rows["lr=0.2"]["seeds"], rows["lr=0.2"]["return mean"]) == (2, pytest.approx(6.0))
    assert report.repeats[["config", "seed", "sweep"]].to_dict("records") == [
        {"config": "lr=0.1", "seed": 2, "sweep": "again-1"}]
    assert pd.read_csv(tmp_path / "out" / "repeats.csv")["seed"].tolist() == [2]
    twice = build_report(uri, ["again", "again"], tmp_path / "twice")  # an experiment named twice is read once
    assert twice.table.equals(report.table) and len(twice.repeats) == 1
    title = "1 trials repeat the seed of a newer trial of their configuration (left out of the aggregates)"
    assert title in (tmp_path / "out" / "results.md").read_text()
    assert title in (tmp_path / "out" / "index.html").read_text()
    assert cli.main(["report", "--tracking-uri", uri, "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert title in out and "results.csv, rl_results.csv, repeats.csv, results.md" in out

    build_report(_status_store(tmp_path), ["status"], tmp_path / "out")
    assert not (tmp_path / "out" / "repeats.csv").exists() and (tmp_path / "out" / "unfinished.csv").exists()


def _most_apart(groups: list[Group], metric: str) -> tuple[Group, int]:
    """The (group, update) whose mean of ``metric`` lies farthest from every other group's at that update."""
    curves = {id(g): g.curve(metric) for g in groups}

    def gap(g: Group, at: float) -> float:
        return min(abs(curves[id(g)].loc[at, "mean"] - curves[id(o)].loc[at, "mean"]) for o in groups if o is not g)
    return max(((g, int(at)) for g in groups for at in curves[id(g)].index), key=lambda pick: gap(*pick))


def test_rl_charts_hover_hide_and_highlight_offline_in_headless_chromium(store, tmp_path):
    """The page with the network blocked draws every figure as a chart; hovering a return curve
    and a heatmap cell reads the configuration, the update (or settings) and the value with its
    spread over seeds; a legend click hides a configuration; the table sorts, filters, and a
    ticked row highlights its curves."""
    uri, _ = store
    report = build_report(uri, ["report-bandit"], tmp_path)
    env = "haepo_GaussianBandit-v0_means_seed=3_num_arms=5"
    group, at = _most_apart(report.groups, RETURN)
    point = group.curve(RETURN).loc[at]
    label = f"report-bandit: HAEPO ({group.config_label}, 2 seeds)"
    cell = next(g for g in report.groups if g.config == {"lr": 0.01, "batch_size": 8})
    with offline_page(report.index) as driver:  # once every chart is drawn
        assert_offline(driver, report.index)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        assert driver.save_screenshot(str(ARTIFACTS / "report.png"))
        assert driver.execute_script("return document.querySelectorAll('div.plot').length") == len(report.figures) == 6
        assert column(driver, "results-0", "seeds") == ["2"] * 4
        returns = chart(driver, f"{env}-return-vs-updates")
        lines = hover(driver, returns, at, point["mean"])
        assert lines[:2] == [label, f"update {at}"]
        value, spread, seeds = tooltip_value(lines, "mean return")
        assert (value, spread, seeds) == (pytest.approx(point["mean"], rel=1e-3, abs=1e-4),
                                          pytest.approx(point["std"], rel=1e-2, abs=1e-4), 2)

        lines = hover(driver, chart(driver, "report-bandit-HAEPO-heatmap-lr-batch"), 1, 0)  # batch 8, lr 0.01
        assert lines[0] == "lr=0.01, batch_size=8"
        value, spread, seeds = tooltip_value(lines, "final mean evaluation return")  # every configuration evaluated
        finals = cell.final(EVAL_RETURN)
        assert (value, spread, seeds) == (pytest.approx(finals.mean(), rel=1e-3, abs=1e-4),
                                          pytest.approx(finals.std(), rel=1e-2, abs=1e-4), 2)

        assert_legend_toggles(driver, returns, label)

        ordered = sorted(report.table["return mean"])
        assert [float(v) for v in sort_by(driver, "results-0", "return mean")] == pytest.approx(ordered, rel=1e-3)
        assert [float(v) for v in sort_by(driver, "results-0", "return mean")] == pytest.approx(ordered[::-1], rel=1e-3)
        filter_rows(driver, "results-0", "lr=0.1")
        assert sorted(column(driver, "results-0", "config")) == ["batch_size=4, lr=0.1", "batch_size=8, lr=0.1"]
        filter_rows(driver, "results-0", "")
        tick_row(driver, "results-0", "config", group.config_label)
        assert_highlighted(driver, returns, label)
