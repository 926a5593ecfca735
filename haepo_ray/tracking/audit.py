"""A sweep's rows on disk against MLflow: every (metric, step) that a trial's ``result.json``
holds (every attempt's: Tune appends), as the sweep logs it, must be in the trial's one run
exactly once. The fault tests and ``bench/chaos.py`` check a sweep with it after kills and
outages.

A run may hold a step that ``result.json`` lacks, and rightly: Tune writes a trial's results in
the driver's staging folder and copies them to storage with its state, while a checkpoint goes
to storage at once; a driver killed between the two leaves the checkpoint's step out of the
``result.json`` on storage, and the restored trial goes on after it. The killed driver may have
logged that step; such rows are counted (``extra``), not failed."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from haepo_ray import names
from haepo_ray.tracking.queries import child_runs, search_all_runs
from haepo_ray.tracking.schema import select_metrics

__all__ = ["Audit", "audit_sweep", "rows_on_disk"]


def rows_on_disk(run_dir: str | Path, metrics: Iterable[str],
                 step_key: str = names.TRAINING_ITERATION) -> dict[str, set[tuple[str, int]]]:
    """trial id -> the (metric, step) rows of its ``result.json`` in ``run_dir`` that match the
    glob patterns ``metrics`` (a line cut short by a kill is left out)."""
    patterns = tuple(metrics)
    out: dict[str, set[tuple[str, int]]] = {}
    for path in sorted(Path(run_dir).glob("*/result.json")):
        rows = []
        for line in path.read_text(errors="replace").splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
        if rows:
            out[rows[0]["trial_id"]] = {(key, int(row.get(step_key) or 0))
                                        for row in rows for key in select_metrics(row, patterns)}
    return out


@dataclass
class Audit:
    """What MLflow holds of a sweep against its trials' ``result.json``."""

    expected: int = 0  # (run, metric, step) rows on disk
    missing: list[tuple[str, str, int]] = field(default_factory=list)  # (trial id, metric, step)
    duplicates: list[tuple[str, str, int]] = field(default_factory=list)  # held more than once
    extra: list[tuple[str, str, int]] = field(default_factory=list)  # held, not on disk (see the module doc)
    runs: dict[str, list[str]] = field(default_factory=dict)  # trial id -> its child runs
    statuses: Counter = field(default_factory=Counter)  # the child runs' MLflow statuses
    parent_status: str | None = None
    outside: int = 0  # runs of the experiment that are neither the parent nor its children

    @property
    def ok(self) -> bool:
        """Every row on disk once, none twice; one FINISHED run per trial; the parent FINISHED."""
        return (not self.missing and not self.duplicates and not self.outside
                and self.parent_status == "FINISHED" and all(len(r) == 1 for r in self.runs.values())
                and set(self.statuses) == {"FINISHED"})

    def summary(self) -> dict:
        return {"ok": self.ok, "rows_on_disk": self.expected, "missing": len(self.missing),
                "duplicates": len(self.duplicates), "not_on_disk": len(self.extra),
                "trials": len(self.runs),
                "trials_with_other_than_one_run": sum(len(r) != 1 for r in self.runs.values()),
                "run_statuses": dict(self.statuses), "parent_status": self.parent_status,
                "runs_outside_the_sweep": self.outside, "first_missing": self.missing[:5],
                "first_duplicates": self.duplicates[:5], "first_not_on_disk": self.extra[:5]}


def audit_sweep(client, experiment_id: str, parent_run_id: str, run_dir: str | Path, metrics: Iterable[str],
                step_key: str = names.TRAINING_ITERATION) -> Audit:
    """Reads every metric history of the parent's children through ``client`` (an
    ``MlflowClient``) and compares it with ``run_dir``'s ``result.json`` files."""
    disk = rows_on_disk(run_dir, metrics, step_key)
    result = Audit(expected=sum(len(rows) for rows in disk.values()))
    result.parent_status = client.get_run(parent_run_id).info.status
    children = child_runs(client, experiment_id, parent_run_id)
    result.outside = len(search_all_runs(client, experiment_id, "")) - 1 - len(children)
    held: Counter = Counter()
    for run in children:
        trial_id = run.data.tags.get(names.TRIAL_ID, "")
        result.runs.setdefault(trial_id, []).append(run.info.run_id)
        result.statuses[run.info.status] += 1
        for key in run.data.metrics:
            held.update((trial_id, key, m.step) for m in client.get_metric_history(run.info.run_id, key))
    for trial_id in disk:
        result.runs.setdefault(trial_id, [])
    expected = {(trial_id, key, step) for trial_id, rows in disk.items() for key, step in rows}
    result.missing = sorted(expected - set(held))
    result.duplicates = sorted(row for row, n in held.items() if n > 1)
    result.extra = sorted(set(held) - expected)
    return result
