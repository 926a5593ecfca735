"""Every private Ray Tune 2.60 attribute the sweep uses, each with its reason; a Ray upgrade is
checked here. Both serve sweeps of many short trials, on the driver, where Tune's controller
runs.

*Launched actors are kept* (:func:`apply`). ``TuneController._maybe_reuse_cached_actor``
hands a pending trial a cached actor (one whose trial ended) and removes the actor that was
being started for that trial. When trials are shorter than an actor's start (a one-iteration
trial: 0.1 s; a start: seconds of importing Ray, RLlib and PyTorch), every actor Tune launches
is killed while it imports: 1,000 one-iteration trials on 8 slots ran on 3 actors; at N = 300
the patch let 8 actors run them and cut the sweep's CPU to 0.81x (BENCHMARKS.md, "Sweeps of
thousands of trials"). Patched, a trial whose own actor is already launching keeps it, and the cached
actor goes to a pending trial whose actor still waits for resources (dropping that request
costs nothing): launched actors join the sweep instead of being thrown away.

*A finished trial's running statistics are let go* (:class:`ReleaseFinishedTrials`, a
callback). For every numeric result key Tune keeps deques of the last 5 and 10 values
(``run_metadata.metric_n_steps``: 175 KB for a one-iteration HAEPO trial) and a copy of the
trial's config in its last result (58 KB), besides a cached JSON of both (105 KB); the driver
kept all of it for every finished trial.
"""

from __future__ import annotations

import functools

from ray.tune import Callback


def launching(controller, actor) -> bool:
    """``actor`` has its resources and its process (Ray's actor manager holds it live) and
    its constructor has not returned (Tune has not started it)."""
    return (actor in controller._actor_manager._live_actors_to_ray_actors_resources
            and actor not in controller._started_actors)


def apply() -> None:
    """Installs the patch in this process, where Tune's controller runs (idempotent)."""
    from ray.tune.execution.tune_controller import TuneController

    original = TuneController._maybe_reuse_cached_actor
    if getattr(original, "keeps_launching_actors", False):
        return

    @functools.wraps(original)
    def maybe_reuse_cached_actor(self, trial) -> bool:
        actor = self._trial_to_actor.get(trial)
        if actor is not None and trial not in self._resetting_trials and launching(self, actor):
            return False
        return original(self, trial)

    maybe_reuse_cached_actor.keeps_launching_actors = True
    TuneController._maybe_reuse_cached_actor = maybe_reuse_cached_actor


class ReleaseFinishedTrials(Callback):
    """Drops, once a trial has ended, its deques of recent values (only a running trial's
    ``last-N-avg`` statistics read them) and its last result's copy of the config (the trial's
    own, equal, stands in); its statistics (``metric_analysis``) and last result stay. Setting
    the attributes refreshes the trial's cached JSON state."""

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        release(trial)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        release(trial)


def release(trial) -> None:
    """See :class:`ReleaseFinishedTrials`."""
    metadata = trial.run_metadata
    metadata.metric_n_steps = {}
    last = metadata.last_result
    if isinstance(last, dict) and "config" in last and last["config"] == trial.config:
        metadata.last_result = {**last, "config": trial.config}
