"""A Tune trainable that holds an RLlib Algorithm and can be *reused* for the next trial.

RLlib's Algorithm does not implement ``reset_config``, so with it Tune starts a new actor (a
new Python process that imports Ray, RLlib and PyTorch: seconds) for every trial. For sweeps of
many short trials that start-up dominates. :func:`reusable` makes a trainable with the same
name, checkpoints and resource request as the algorithm, whose ``reset_config`` stops the
algorithm and builds the next trial's in the same process; ``TuneConfig(reuse_actors=True)``
then keeps actors alive across trials (spec key ``reuse_actors``).

Checkpoints are the algorithm's own (``Algorithm.from_checkpoint`` loads them).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from ray import tune


class ReusableAlgorithm(tune.Trainable):
    """Runs ``algo_cls`` (set by :func:`reusable`) inside this Tune actor."""

    algo_cls: type | None = None

    def setup(self, config: dict[str, Any]) -> None:
        self.algo = self._build(config)

    def _build(self, config: dict[str, Any]):
        # The trial's storage: the algorithm shares this trial's folder (no stray ~/ray_results).
        return self.algo_cls(config=dict(config), storage=self._storage)

    def step(self) -> dict[str, Any]:
        # Algorithm.step() reads its own iteration counter (evaluation intervals).
        self.algo._iteration = self.iteration
        return self.algo.step()

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        self.algo._iteration = self.iteration
        self.algo.save_checkpoint(checkpoint_dir)

    def load_checkpoint(self, checkpoint: str | dict) -> None:
        self.algo.load_checkpoint(checkpoint)

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self.algo.stop()
        self.algo = self._build(new_config)
        return True

    def cleanup(self) -> None:
        algo = getattr(self, "algo", None)
        if algo is not None:
            algo.stop()

    @classmethod
    def default_resource_request(cls, config):
        return cls.algo_cls.default_resource_request(config)


@cache
def reusable(algorithm: str) -> type[ReusableAlgorithm]:
    """The reusable trainable for a Tune-registered RLlib algorithm, named like it."""
    from ray.tune.registry import get_trainable_cls

    algo_cls = get_trainable_cls(algorithm)
    return type(algorithm, (ReusableAlgorithm,), {
        "algo_cls": algo_cls,
        "__module__": __name__,
        "__qualname__": algorithm,
        "__doc__": f"{algorithm} in a reusable Tune actor (see haepo_ray.sweep.trainable).",
    })
