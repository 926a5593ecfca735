"""The MLflow runs of a sweep (or of one ``haepo train`` run): create or reopen a trial's child
run with its params, write its metric and tag rows in MLflow's batch sizes, its final checkpoint
and status, and the parent's best trial and ``summary.json``.

Each write goes through the retried calls of :mod:`haepo_ray.tracking.retry` with ``hold``: a
write that fails for want of MLflow raises :class:`~haepo_ray.tracking.retry.Unavailable` (for
rows, :class:`RowsUnavailable` with the rows not known to be written) and the writer's
transport (:mod:`haepo_ray.tracking.writer`) keeps it for later. A write that may have reached
MLflow before its answer was lost lands once when tried again: a create looks for the run
first; a batch of rows is sent again with the same rows, which MLflow's SQL stores keep once.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from haepo_ray import names
from haepo_ray.tracking.logged import highest_steps
from haepo_ray.tracking.messages import EndRun, StartRun, steps_text
from haepo_ray.tracking.queries import find_trial_run
from haepo_ray.tracking.retry import MLflowCalls, Unavailable
from haepo_ray.tracking.schema import MAX_METRICS_PER_BATCH, MAX_TAG_VALUE, MAX_TAGS_PER_BATCH, sanitize_key, tag_values
from haepo_ray.upstream import mlflow as mlflow_internals

__all__ = ["Reopened", "RowsUnavailable", "SweepRuns"]


@dataclass(frozen=True)
class Reopened:
    """What the run of a trial of an earlier session already holds: its highest logged step
    per metric, and its count of steps reported again (``haepo.replayed_steps``)."""

    steps: Mapping[str, int] | None  # None: not read (the writer keeps what it knows)
    replayed: int


class RowsUnavailable(Unavailable):
    """MLflow went away while a trial's rows were written: ``rows`` from the batch that failed
    on (which may have been written) to the last."""

    def __init__(self, error: Unavailable, trial_id: str, rows: list):
        super().__init__(str(error))
        self.trial_id, self.rows = trial_id, rows


class SweepRuns:
    """The parent run's children, trial id -> run id, and the writes that make them."""

    def __init__(self, calls: MLflowCalls):
        self.calls = calls
        self.experiment_id: str | None = None
        self.parent_run_id: str | None = None
        self.run_ids: dict[str, str] = {}  # trial_id -> child run id, created or reopened here
        self.earlier_runs: dict[str, str] = {}  # trial_id -> child run id of an earlier session
        self._tried: set[str] = set()  # trials whose create was tried: a repeat looks first
        self._lock = threading.Lock()

    def open(self, experiment_id: str, parent_run_id: str | None, earlier_runs: Mapping[str, str] | None) -> None:
        self.experiment_id, self.parent_run_id = experiment_id, parent_run_id
        self.earlier_runs = dict(earlier_runs or {})

    @property
    def client(self):
        return self.calls.client

    def run_id_of(self, trial_id: str) -> str | None:
        """A trial's child run: created or reopened in this session, or made by an earlier one."""
        with self._lock:
            return self.run_ids.get(trial_id) or self.earlier_runs.get(trial_id)

    def has_run(self, trial_id: str) -> bool:
        """The trial's run was created or reopened in this session."""
        return trial_id in self.run_ids

    def _call(self, what: str, trial_id: str | None, detail: str, fn, *, retry_fn=None) -> tuple[bool, Any]:
        return self.calls.call(what, trial_id, detail, fn, retry_fn=retry_fn, hold=True)

    def start_run(self, msg: StartRun, known: bool) -> Reopened | None:
        """Creates the trial's run, or reopens that of an earlier session; logs the params it
        does not hold. For a reopened run, what it holds (its steps only unless ``known``, the
        writer knowing them already); None for a new run or one that could not be made."""
        trial_id = msg.trial_id
        run_id = self.run_id_of(trial_id)
        earlier = run_id is not None

        def create() -> str:
            parent = {names.PARENT_RUN: self.parent_run_id} if self.parent_run_id else {}
            tags = tag_values({**parent, **msg.tags})
            return self.client.create_run(self.experiment_id, tags=tags, run_name=msg.name).info.run_id

        def find_or_create() -> str:  # a retry must not create a second run
            return find_trial_run(self.client, self.experiment_id, self.parent_run_id, trial_id) or create()

        if run_id is None:
            tried = trial_id in self._tried
            self._tried.add(trial_id)
            ok, run_id = self._call("child run", trial_id, f"child run of trial {msg.name}",
                                    find_or_create if tried else create, retry_fn=find_or_create)
            if not ok:
                return None
        else:
            self._call("status", trial_id, f"status RUNNING of trial {msg.name}",
                       lambda: self.client.update_run(run_id, status="RUNNING"))
        with self._lock:
            self.run_ids[trial_id] = run_id
        logged: Mapping[str, str] = {}
        reopened = None
        if earlier:
            # A resumed run: keep what it holds. (A restored trial's config went through JSON,
            # so some values print differently; MLflow refuses to change a param.)
            ok, run = self._call("params", trial_id, "params already logged (resume)",
                                 lambda: self.client.get_run(run_id))
            if ok:
                logged = run.data.params
                steps = None
                if not known:
                    found, held = self._call("metrics", trial_id, "steps already logged (resume)",
                                             lambda: highest_steps(self.client, run_id, run.data.metrics))
                    steps = held if found else None
                reopened = Reopened(steps, int(run.data.tags.get(names.REPLAYED_STEPS, 0)))
        self.calls.log_params(run_id, trial_id, {k: v for k, v in msg.params.items() if k not in logged}, hold=True)
        return reopened

    def write_rows(self, trial_id: str, rows: list) -> None:
        """Writes a trial's metric rows and its tags (the last value of each), both in the same
        ``log_batch`` calls; :class:`RowsUnavailable` from the call MLflow went away on."""
        from mlflow.entities import Metric, RunTag

        run_id = self.run_ids[trial_id]
        metrics = [r for r in rows if isinstance(r, Metric)]
        tags = list({r.key: r for r in rows if isinstance(r, RunTag)}.values())
        while metrics or tags:
            t, tags = tags[:MAX_TAGS_PER_BATCH], tags[MAX_TAGS_PER_BATCH:]
            size = MAX_METRICS_PER_BATCH - len(t)
            m, metrics = metrics[:size], metrics[size:]
            detail = ", ".join(part for part in (
                f"{steps_text(row.step for row in m)}: {len(m)} values" if m else "",
                f"tags {sorted(tag.key for tag in t)}" if t else "") if part)
            try:
                self._call("metrics" if m else "tags", trial_id, detail,
                           lambda m=m, t=t: self.client.log_batch(run_id, metrics=m, tags=t))
            except Unavailable as err:
                raise RowsUnavailable(err, trial_id, m + metrics + t + tags) from err

    @staticmethod
    def end_tags(msg: EndRun) -> dict[str, str]:
        """The tags a trial's end gives its run: failures, and the error's end."""
        tags = {names.NUM_FAILURES: str(msg.num_failures)}
        if msg.error:
            tags[names.ERROR] = msg.error[-MAX_TAG_VALUE:]
        return tags

    def end_run(self, msg: EndRun) -> None:
        """The trial's final checkpoint (if any) as artifacts, then its status."""
        run_id = self.run_ids[msg.trial_id]
        if msg.checkpoint is not None:
            self._log_checkpoint(msg.trial_id, run_id, msg.checkpoint, msg.root_files)
        self._call("status", msg.trial_id, f"status {msg.status}",
                   lambda: mlflow_internals.set_terminated(self.client, run_id, msg.status))

    def _log_checkpoint(self, trial_id: str, run_id: str, checkpoint, root_files: tuple[str, ...]) -> None:
        path = getattr(checkpoint, "path", None)

        def log(local: str) -> None:
            self.client.log_artifacts(run_id, local, artifact_path="checkpoint")
            for name in root_files:
                if os.path.isfile(os.path.join(local, name)):
                    self.client.log_artifact(run_id, os.path.join(local, name))

        def upload() -> None:
            import pyarrow.fs

            fs = getattr(checkpoint, "filesystem", None)
            if fs is None or isinstance(fs, pyarrow.fs.LocalFileSystem):
                log(path)
            else:
                with checkpoint.as_directory() as local:
                    log(local)
            self.client.set_tag(run_id, names.CHECKPOINT, str(path))

        self._call("artifact", trial_id, f"final checkpoint {path}", upload)

    def end_parent(self, status: str) -> None:
        self._call("status", None, f"parent status {status}",
                   lambda: self.client.set_terminated(self.parent_run_id, status=status))

    def log_summary(self, summary: Mapping[str, Any], timestamp_ms: int) -> None:
        """The parent's best trial (tags, ``best/<metric>``) and ``summary.json``. Each session
        of the sweep (a resume after Ctrl-C or a failed trial) ends with a summary: its
        ``best/<metric>`` goes to the step after those the parent holds, each step once."""
        from mlflow.entities import Metric, RunTag

        best, metric = summary.get("best"), summary.get("metric")
        tags = [RunTag(names.NUM_TRIALS, str(summary.get("num_trials", 0)))]
        metrics = []
        if best:
            tags.append(RunTag(names.BEST_TRIAL_ID, best["trial_id"]))
            run_id = self.run_id_of(best["trial_id"])
            if run_id:
                tags.append(RunTag(names.BEST_RUN_ID, run_id))
            if best.get("value") is not None and metric:
                key = sanitize_key(f"best/{metric}")
                held = None
                if self.earlier_runs:  # a resumed sweep: its parent may hold summaries
                    _, held = self._call("metrics", None, f"{key} already logged (resume)",
                                         lambda: self.client.get_metric_history(self.parent_run_id, key))
                step = 1 + max((m.step for m in held or ()), default=-1)
                metrics.append(Metric(key, float(best["value"]), timestamp_ms, step))
        text = json.dumps(dict(summary, run_ids={**self.earlier_runs, **self.run_ids},
                               parent_run_id=self.parent_run_id), indent=2, default=str)
        self._call("tags", None, "best trial of the sweep",
                   lambda: self.client.log_batch(self.parent_run_id, metrics=metrics, tags=tags))
        self._call("artifact", None, "summary.json",
                   lambda: self.client.log_text(self.parent_run_id, text, "summary.json"))
