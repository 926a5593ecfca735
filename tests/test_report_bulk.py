"""The report's batched metric readers (:mod:`haepo_ray.report.histories`) give exactly the
curves of one ``get_metric_history`` per run and metric, on a real SQLite store and on a real
``mlflow server`` backed by it (run with ``--static-prefix``).

The store: 100 small trials and a few special ones: a step logged twice (later timestamp; same
timestamp), in a run of many steps and in one of one step (whose histories the report takes from
its latest values), a NaN, metrics with different step counts, a run with no metrics, a language-model
trial, a run whose 30,000 values of one metric fill a bulk response alone and two of 15,000 that
fill one together (the server's cap is 25,000 values per response); and runs the report must
not read: a deleted trial, a trial of another experiment.

The runs themselves (:mod:`haepo_ray.report.records`) are read as ``MlflowClient.search_runs``
finds them, without it: through the SQL tables and through the server's REST API.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from helpers import MLflowServer, sqlite_store

from haepo_ray import names
from haepo_ray.report import histories, runs
from haepo_ray.report.histories import http_histories, per_run_histories, read_histories, sql_histories
from haepo_ray.report.kinds import LLM, RL
from haepo_ray.report.records import RunRecord, trial_runs
from haepo_ray.report.runs import RETURN, SECONDS, curve_keys, curves, load_trials
from haepo_ray.tracking import TRIAL_ROLE, search_all_runs

EXPERIMENT = "bulk"
SMALL = 100
LONG = 30_000  # more values of one metric than a bulk response holds (25,000)
HALF = 15_000


def _metrics(key: str, values, start: int = 1, timestamp: int = 0):
    from mlflow.entities import Metric

    return [Metric(key, float(v), timestamp, step) for step, v in enumerate(values, start)]


def _build(db: Path) -> dict[str, str]:
    """The store (see the module's docstring); the special runs' ids by name."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(sqlite_store(db))
    exp = client.create_experiment(EXPERIMENT, artifact_location=(db.parent / "artifacts").as_uri())
    parent = client.create_run(exp, tags={names.ROLE: "sweep"}).info.run_id

    def child(name: str, metrics: list, tags: dict | None = None) -> str:
        run = client.create_run(exp, run_name=name, tags={
            names.PARENT_RUN: parent, names.ROLE: "trial", names.ALGORITHM: "HAEPO", names.ENV: "haepo/ChainMDP-v0",
            names.SEARCH_VALUES: json.dumps({"lr": 0.1, "seed": name}), **(tags or {})}).info.run_id
        for start in range(0, len(metrics), 1000):
            client.log_batch(run, metrics=metrics[start:start + 1000])
        client.set_terminated(run)
        return run

    for i in range(SMALL):
        child(f"small-{i}", _metrics(RETURN, range(i % 4)) + _metrics(SECONDS, range(i % 3)))
    client.delete_run(child("deleted", _metrics(RETURN, [1.0])))
    other = client.create_experiment("other", artifact_location=(db.parent / "artifacts").as_uri())
    client.set_terminated(client.create_run(other, tags={names.ROLE: "trial", names.PARENT_RUN: parent}).info.run_id)
    return {
        # step 2 twice (the later one, smaller, wins), step 3 twice at one time (the larger wins)
        "twice": child("twice", _metrics(RETURN, [1.0, 1.0]) + _metrics(RETURN, [0.5], 2, timestamp=20)
                       + _metrics(RETURN, [2.0], 3, timestamp=5) + _metrics(RETURN, [3.0], 3, timestamp=5)
                       + _metrics(SECONDS, [1, 2, 3])
                       + _metrics(names.POLICY_ENTROPY, [0.9, 0.8, 0.7])),
        "ragged": child("ragged", _metrics(RETURN, [1, 2, 3, math.nan, 5]) + _metrics(names.REGRET_PER_STEP, [4, 3])),
        # one step, logged twice (the later one, smaller, wins; at one time the larger), a NaN
        "once": child("once", _metrics(RETURN, [1.0]) + _metrics(RETURN, [0.5], timestamp=20)
                      + _metrics(SECONDS, [2.0], timestamp=5) + _metrics(SECONDS, [3.0], timestamp=5)
                      + _metrics(names.REGRET_PER_STEP, [math.nan])),
        "empty": child("empty", [], tags={"blank": ""}),  # REST's JSON leaves an empty value out
        "llm": child("llm", _metrics(names.llm_eval(names.LLM_REWARD), [0.1, 0.2, 0.3])
                     + _metrics("peak_memory_mb/generation", [7, 9]) + _metrics("peak_memory_mb/update", [8, 6]),
                     tags={names.MODEL: "tiny", names.DATA: "tldr"}),
        "long": child("long", _metrics(RETURN, range(LONG))),
        "half-a": child("half-a", _metrics(RETURN, range(HALF))),
        "half-b": child("half-b", _metrics(RETURN, range(HALF, 2 * HALF))),
    }


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """(root, SQLite URI, special run ids): the server's database, ``root/server.db``."""
    root = tmp_path_factory.mktemp("bulk")
    return root, f"sqlite:///{root / 'server.db'}", _build(root / "server.db")


@pytest.fixture(scope="module")
def server(store):
    """The store's server, its API under a static prefix (``--static-prefix /p``: the bulk
    endpoint under ``/p`` too)."""
    live = MLflowServer(store[0], static_prefix="/p")
    try:
        yield live
    finally:
        live.kill()


@pytest.fixture(scope="module")
def reference(store):
    """(run id -> its curves' keys, run id -> its kind, the per-run reader's histories) of every
    trial, read once from the SQLite store (the server serves the same file)."""
    client = _client(store[1])
    wanted, kinds = _wanted(client)
    return wanted, kinds, per_run_histories(client, wanted)


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


def _wanted(client) -> tuple[dict[str, list[str]], dict[str, object]]:
    """(run id -> its curves' metric keys, run id -> its kind) of every trial."""
    exp = client.get_experiment_by_name(EXPERIMENT).experiment_id
    runs = client.search_runs([exp], f"tags.`{names.ROLE}` = 'trial'", max_results=1000)
    kinds = {r.info.run_id: LLM if names.MODEL in r.data.tags else RL for r in runs}
    return {r.info.run_id: curve_keys(r.data.metrics, kinds[r.info.run_id]) for r in runs}, kinds


def _assert_same_curves(got, expected, wanted, kinds) -> None:
    for run_id, keys in wanted.items():
        pd.testing.assert_frame_equal(curves(got.get(run_id, {}), keys, kinds[run_id]),
                                      curves(expected.get(run_id, {}), keys, kinds[run_id]), check_exact=True)


def test_per_run_reader_keeps_a_steps_last_value(store):
    """The reference itself: a step logged twice keeps its later value (by timestamp, then by
    value), a NaN stays NaN, a run with no metrics has no curves."""
    _, uri, ids = store
    client = _client(uri)
    wanted, kinds = _wanted(client)
    got = per_run_histories(client, {i: wanted[i] for i in (ids["twice"], ids["once"], ids["ragged"], ids["empty"])})
    assert got[ids["twice"]][RETURN] == {1: 1.0, 2: 0.5, 3: 3.0}
    assert got[ids["once"]][RETURN] == {1: 0.5} and got[ids["once"]][SECONDS] == {1: 3.0}
    assert math.isnan(got[ids["ragged"]][RETURN][4]) and got[ids["ragged"]][names.REGRET_PER_STEP] == {1: 4.0, 2: 3.0}
    assert curves(got[ids["empty"]], wanted[ids["empty"]], RL).empty


def test_sql_reader_gives_the_per_run_curves(store, reference, monkeypatch):
    """In chunks of 500 runs (one chunk here) and of 7 (15 chunks, the last one short)."""
    _, uri, _ = store
    client = _client(uri)
    wanted, kinds, expected = reference
    assert read_histories(client, wanted).keys() == sql_histories(client, wanted).keys()
    _assert_same_curves(sql_histories(client, wanted), expected, wanted, kinds)
    monkeypatch.setattr(histories, "SQL_RUNS", 7)
    _assert_same_curves(sql_histories(client, wanted), expected, wanted, kinds)


def test_http_reader_gives_the_per_run_curves(store, reference, server):
    """Through the server's bulk endpoint (108 runs: two chunks per metric), with responses
    cut off at 25,000 values: by one run alone (read per run) and by two together (the second
    asked again)."""
    _, uri, ids = store
    client = _client(server.uri)
    wanted, kinds, expected = reference
    assert len(expected[ids["long"]][RETURN]) == LONG
    _assert_same_curves(http_histories(client, wanted), expected, wanted, kinds)
    for names_ in (["long"], ["half-a", "half-b"], ["half-b", "half-a"]):
        part = {ids[n]: wanted[ids[n]] for n in names_}
        got = http_histories(client, part)
        assert {run: len(h[RETURN]) for run, h in got.items()} == {run: len(expected[run][RETURN]) for run in part}
        _assert_same_curves(got, expected, part, kinds)
    assert read_histories(client, {ids["twice"]: [RETURN]})[ids["twice"]][RETURN] == {1: 1.0, 2: 0.5, 3: 3.0}


def test_trials_are_the_same_from_sqlite_and_from_the_server(store, reference, server):
    """load_trials reads the same trials (curves, configs, statuses, provenance) either way,
    with the per-run reader's curves."""
    _, uri, _ = store
    local, remote = (sorted(load_trials(u, [EXPERIMENT]), key=lambda t: t.run_id) for u in (uri, server.uri))
    wanted, kinds, expected = reference
    assert len(local) == len(remote) == SMALL + 8
    for a, b in zip(local, remote):
        pd.testing.assert_frame_equal(a.curves, b.curves, check_exact=True)
        pd.testing.assert_frame_equal(a.curves, curves(expected[a.run_id], wanted[a.run_id], kinds[a.run_id]),
                                      check_exact=True)
        a.curves = b.curves = None
        assert a == b


def _search_runs_records(client) -> list[RunRecord]:
    """The reference: the trial runs of :data:`EXPERIMENT` from ``MlflowClient.search_runs``."""
    exp = client.get_experiment_by_name(EXPERIMENT).experiment_id
    records = [RunRecord.of(r) for r in search_all_runs(client, exp, f"tags.`{names.ROLE}` = '{TRIAL_ROLE}'")]
    for record in records:
        record.metrics.sort()
    return records


def test_records_are_what_search_runs_finds(store, server):
    """The SQL tables and the REST API (under the server's static prefix) give the runs, in
    the order, with the statuses, tags (an empty one too), params and metric keys of
    ``search_runs`` (not the deleted trial nor the other experiment's), and each metric's
    latest step and value as MLflow picks them from its history."""
    _, uri, ids = store
    expected = _search_runs_records(_client(uri))
    assert len(expected) == SMALL + 8
    assert next(r.tags for r in expected if r.run_id == ids["empty"])["blank"] == ""
    latest = {r.run_id: {key: _latest(_client(uri).get_metric_history(r.run_id, key)) for key in r.metrics}
              for r in expected}
    assert latest[ids["once"]] == {RETURN: (1, 0.5), SECONDS: (1, 3.0), names.REGRET_PER_STEP: (1, "nan")}
    for u in (uri, server.uri):
        client = _client(u)
        got = trial_runs(client, client.get_experiment_by_name(EXPERIMENT).experiment_id, names.ROLE, TRIAL_ROLE)
        assert {r.run_id: {k: _nan(v) for k, v in r.latest.items()} for r in got} == latest
        for record in got:
            record.metrics.sort()
            record.latest = {}
        assert got == expected


def _latest(history) -> tuple[int, float | str]:
    """MLflow's latest value of a history: of the highest step, the latest logged, the largest."""
    last = max(history, key=lambda m: (m.step, m.timestamp, m.value))
    return _nan((last.step, last.value))


def _nan(latest: tuple[int, float]) -> tuple[int, float | str]:
    """``(step, value)`` with NaN as ``"nan"``, which equals itself."""
    return latest[0], "nan" if math.isnan(latest[1]) else latest[1]


def test_the_report_asks_no_search_runs(store, server, monkeypatch):
    """``load_trials`` reads SQLite and the server without ``MlflowClient.search_runs``,
    whose entities took most of a report's minute at 10,000 runs."""
    from mlflow.tracking import MlflowClient

    def refused(*args, **kwargs):
        raise AssertionError("search_runs asked")

    monkeypatch.setattr(MlflowClient, "search_runs", refused)
    for u in (store[1], server.uri):
        assert len(load_trials(u, [EXPERIMENT])) == SMALL + 8


def test_one_step_metrics_are_not_read_again(store, server, monkeypatch):
    """An RL trial's metrics whose latest step is the first are taken from its latest values
    (the curves above are the per-run reader's all the same); the others, and a language-model
    trial's, are read as histories."""
    _, uri, ids = store
    asked = {}

    def spy(client, wanted):
        asked.update(wanted)
        return read_histories(client, wanted)

    monkeypatch.setattr(runs, "read_histories", spy)
    for u in (uri, server.uri):
        asked.clear()
        load_trials(u, [EXPERIMENT])
        assert ids["once"] not in asked and ids["empty"] not in asked
        assert set(asked[ids["ragged"]]) == {RETURN, names.REGRET_PER_STEP}
        assert set(asked[ids["llm"]]) == {names.llm_eval(names.LLM_REWARD), "peak_memory_mb/generation",
                                          "peak_memory_mb/update"}
        assert ids["twice"] in asked
