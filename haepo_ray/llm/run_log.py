"""What a language-model run records as it goes: its rows, written to ``metrics.jsonl`` and
``generations.jsonl`` and handed to a callback (:class:`RunWriter`), and the wall time and
phase times each row carries (:class:`RunClock`). :class:`~haepo_ray.llm.train.LLMRun` holds one
of each. :func:`rl_metrics`: what of an RL row is logged as metrics.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from haepo_ray import names

METRICS_FILE = "metrics.jsonl"
GENERATIONS_FILE = names.LLM_GENERATIONS

Callback = Callable[[dict[str, Any]], None]


class RunWriter:
    """The output files (rank 0 only; other workers keep the rows and write nothing)."""

    def __init__(self, out_dir: Path | None, callback: Callback | None, *, append: bool = False) -> None:
        mode = "a" if append else "w"
        self.metrics = (out_dir / METRICS_FILE).open(mode) if out_dir else None
        self.generations = (out_dir / GENERATIONS_FILE).open(mode) if out_dir else None
        self.callback = callback
        self.rows: list[dict[str, Any]] = []

    def metric(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if self.metrics:
            self.metrics.write(json.dumps(row) + "\n")
            self.metrics.flush()
        if self.callback is not None:
            self.callback(row)

    def generation(self, row: dict[str, Any]) -> None:
        if self.generations:
            self.generations.write(json.dumps(row) + "\n")
            self.generations.flush()

    def close(self) -> None:
        for f in (self.metrics, self.generations):
            if f:
                f.close()


class RunClock:
    """A run's wall time since its start (plus a restored run's earlier time) and the cumulative
    seconds of its phases (:data:`haepo_ray.names.LLM_TIME_PHASES`)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.before = 0.0
        self.phases = dict.fromkeys(names.LLM_TIME_PHASES, 0.0)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] += time.perf_counter() - start

    def times(self) -> dict[str, Any]:
        """``train_time_s`` and ``phase_time_s`` of a metric row."""
        return {names.LLM_TRAIN_TIME: self.before + time.perf_counter() - self.start,
                names.LLM_PHASE_TIME: dict(self.phases)}

    def credit(self, name: str, seconds: float) -> None:
        """Count ``seconds`` spent elsewhere (a shared SFT start's) as this run's, in phase ``name``."""
        self.before += seconds
        self.phases[name] += seconds

    def resume(self, row: dict[str, Any]) -> None:
        """Go on from the times of a restored run's last row."""
        self.before = row[names.LLM_TRAIN_TIME]
        for name, seconds in row[names.LLM_PHASE_TIME].items():
            self.phases[name] += seconds


def rl_metrics(row: dict[str, Any]) -> dict[str, Any]:
    """An RL update's row (:meth:`~haepo_ray.llm.train.LLMRun.rl`) as metrics: every value but its ``phase`` label."""
    return {key: value for key, value in row.items() if key != "phase"}
