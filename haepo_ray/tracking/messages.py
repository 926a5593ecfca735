"""The messages a sweep's driver queues for the MLflow writer (:mod:`haepo_ray.tracking.writer`),
and what each would write, for the not-logged record."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

__all__ = ["Admitted", "Barrier", "EndParent", "EndRun", "Item", "Message", "Metrics", "StartRun", "Stop", "Summary",
           "Tags", "steps_text", "unwritten"]


@dataclass(frozen=True)
class StartRun:
    """Create (or, resumed, reopen) a trial's child run and log its params."""

    what: ClassVar[str] = "child run"
    trial_id: str
    name: str
    tags: Mapping[str, str]
    params: Mapping[str, str]


@dataclass(frozen=True)
class Metrics:
    """One result's metrics of a trial, at its step (the sweep's step key)."""

    what: ClassVar[str] = "metrics"
    trial_id: str
    step: int
    timestamp_ms: int
    values: Mapping[str, float]


@dataclass(frozen=True)
class Tags:
    what: ClassVar[str] = "tags"
    trial_id: str
    tags: Mapping[str, str]


@dataclass(frozen=True)
class EndRun:
    """A trial ended: its failure count and error, its final checkpoint (None: none to
    upload), its status."""

    what: ClassVar[str] = "status"
    trial_id: str
    status: str  # FINISHED | FAILED | KILLED
    checkpoint: Any
    error: str | None
    num_failures: int
    root_files: tuple[str, ...] = ()  # files of the checkpoint also logged at the run's root


@dataclass(frozen=True)
class Summary:
    """The parent's best trial and ``summary.json`` (see ``schema.summarize_trials``)."""

    what: ClassVar[str] = "tags"
    summary: Mapping[str, Any]
    timestamp_ms: int = field(default_factory=lambda: int(time.time() * 1000))  # of best/<metric>


@dataclass(frozen=True)
class EndParent:
    what: ClassVar[str] = "status"
    status: str


@dataclass(frozen=True)
class Barrier:
    """Set ``done`` once everything queued before it is written."""

    what: ClassVar[str] = "metrics"
    done: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class Stop:
    """Write what is pending, then end the thread."""

    what: ClassVar[str] = "metrics"


@dataclass(frozen=True)
class Admitted:
    """Metric rows (admitted: :class:`~haepo_ray.tracking.logged.LoggedSteps`) and tags of one
    trial, not written when MLflow went away."""

    what: ClassVar[str] = "metrics"
    trial_id: str
    rows: tuple  # of mlflow.entities.Metric and RunTag


Message = StartRun | Metrics | Tags | EndRun | Summary | EndParent | Barrier | Stop
Item = Message | Admitted  # what the backlog holds


def steps_text(steps) -> str:
    """``step 3`` or ``steps 3-7``."""
    steps = sorted(set(steps))
    return f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"


def unwritten(item: Item) -> list[tuple[str, str]]:
    """(what, detail) of each write a backlog item holds, for the not-logged record."""
    match item:
        case Metrics():
            return [("metrics", f"{steps_text([item.step])}: {len(item.values)} values")]
        case Admitted():
            steps = [row.step for row in item.rows if hasattr(row, "step")]
            tags = sorted(row.key for row in item.rows if not hasattr(row, "step"))
            return ([("metrics", f"{steps_text(steps)}: {len(steps)} values")] if steps else []) + (
                [("tags", f"tags {tags}")] if tags else [])
        case StartRun():
            return [("child run", f"child run of trial {item.name}")]
        case Tags():
            return [("tags", f"tags {sorted(item.tags)}")]
        case EndRun():
            checkpoint = getattr(item.checkpoint, "path", None)
            return ([("artifact", f"final checkpoint {checkpoint}")] if checkpoint else []) + [
                ("status", f"status {item.status}")]
        case EndParent():
            return [("status", f"parent status {item.status}")]
        case _:
            return [("tags", "best trial of the sweep"), ("artifact", "summary.json")]
