"""What each trial's MLflow run already holds, so that a restored or resumed trial never logs
a (run, metric, step) twice.

A trial's step is the sweep's step key (``training_iteration`` for RL trials, ``update`` for
language-model trials), whichever metrics the spec logs, the step key among them or not. The
writer logs a trial's steps in order, each step's values in one ``log_batch`` call unless
MLflow's per-call limit splits it, so a killed driver leaves at most the highest step partly
written. Hence the rule of :meth:`LoggedSteps.admit`: a step below the highest logged one is
not logged again; the highest step gets only the metrics it lacks; a higher step is new.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


class LoggedSteps:
    """Per trial, the highest step logged of each metric (in MLflow or queued to it)."""

    def __init__(self) -> None:
        self._steps: dict[str, dict[str, int]] = {}

    def __contains__(self, trial_id: str) -> bool:
        return trial_id in self._steps

    def learn(self, trial_id: str, steps: Mapping[str, int]) -> None:
        """Records what the trial's run already holds: metric -> highest step."""
        known = self._steps.setdefault(trial_id, {})
        for key, step in steps.items():
            known[key] = max(step, known.get(key, step))

    def admit(self, trial_id: str, step: int, values: Mapping[str, float]) -> tuple[dict[str, float], bool]:
        """``(to_log, replayed)``: the values of ``step`` not logged yet (recorded as logged
        now), and whether the trial had reached ``step`` before (a step reported again)."""
        known = self._steps.setdefault(trial_id, {})
        top = max(known.values(), default=None)
        if top is not None and step < top:
            return {}, True
        new = {k: v for k, v in values.items() if k not in known or known[k] < step}
        for key in new:
            known[key] = step
        return new, top is not None and step == top


def highest_steps(client, run_id: str, keys: Iterable[str]) -> dict[str, int]:
    """Metric -> highest step of the run's histories of ``keys`` (from every row, whichever
    row MLflow reports as the latest)."""
    steps = {}
    for key in keys:
        history = client.get_metric_history(run_id, key)
        if history:
            steps[key] = max(m.step for m in history)
    return steps
