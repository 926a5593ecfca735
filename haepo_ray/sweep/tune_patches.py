"""A patch of Ray Tune 2.60's trial controller, with its reason; a Ray upgrade is checked here.

``TuneController._maybe_reuse_cached_actor`` hands a pending trial a cached actor (one whose
trial ended) and removes the actor that was being started for that trial. When trials are
shorter than an actor's start (a one-iteration trial: 0.1 s; a start: seconds of importing
Ray, RLlib and PyTorch), every actor Tune launches is killed while it imports: 1,000
one-iteration trials on 8 slots ran on 3 actors while the launched-and-killed ones took
about a third of all CPU (BENCHMARKS.md, "Sweeps of thousands of trials"). Patched, a trial
whose own actor is already launching keeps it, and the cached actor goes to a pending trial
whose actor still waits for resources (dropping that request costs nothing): launched actors
join the sweep instead of being thrown away.
"""

from __future__ import annotations

import functools


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
