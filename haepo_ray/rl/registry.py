"""haepo-ray's algorithms by name, as Ray Tune and sweep specs call them.

:func:`register_algorithms` registers HAEPO, DPO and GRPO with Ray Tune, so that
``tune.Tuner("HAEPO", ...)`` works; nothing registers on import. :func:`algorithm_class`
resolves any name a spec or ``haepo train`` may use: haepo-ray's own, else one that Tune
knows (RLlib's PPO, ...).
"""

from __future__ import annotations

from difflib import get_close_matches
from importlib import import_module

# name -> (module, class); the modules import RLlib, so they load on first use.
ALGORITHMS: dict[str, tuple[str, str]] = {
    "HAEPO": ("haepo_ray.rl.algorithm", "HAEPO"),
    "DPO": ("haepo_ray.rl.baselines.dpo", "DPO"),
    "GRPO": ("haepo_ray.rl.baselines.grpo", "GRPO"),
}


class UnknownAlgorithm(LookupError):
    """A name that is neither haepo-ray's nor registered with Ray Tune as an RLlib algorithm."""


def _load(name: str) -> type:
    module, cls = ALGORITHMS[name]
    return getattr(import_module(module), cls)


def register_algorithms() -> None:
    """Registers HAEPO, DPO and GRPO with Ray Tune's trainable registry (idempotent)."""
    from ray.tune.registry import register_trainable

    for name in ALGORITHMS:
        register_trainable(name, _load(name))


def algorithm_class(name: str) -> type:
    """The RLlib Algorithm class called ``name``: haepo-ray's, else one registered with Ray
    Tune, else RLlib's (importing that algorithm alone, where Tune's lookup imports all of
    them); raises :class:`UnknownAlgorithm`, naming a close match."""
    if name in ALGORITHMS:
        register_algorithms()
        return _load(name)
    from ray.rllib.algorithms.registry import ALGORITHMS as RLLIB_ALGORITHMS

    from haepo_ray.upstream.tune import registered_trainable

    cls = registered_trainable(name)
    if cls is None and name in RLLIB_ALGORITHMS:
        cls = RLLIB_ALGORITHMS[name]()[0]
    if cls is None:
        known = known_algorithms()
        close = [k for k in known if k.lower() == name.lower()] or get_close_matches(name, known, n=1)
        raise UnknownAlgorithm(f"unknown algorithm {name!r}" + (f" (did you mean {close[0]}?)" if close else "")
                               + f"; allowed: {', '.join(known)}")
    if not hasattr(cls, "get_default_config"):
        raise UnknownAlgorithm(f"{name} is registered with Ray Tune but is not an RLlib algorithm")
    return cls


def known_algorithms() -> list[str]:
    """haepo-ray's algorithms, then RLlib's, for error messages."""
    from ray.rllib.algorithms.registry import ALGORITHMS as RLLIB_ALGORITHMS

    return [*ALGORITHMS, *sorted(RLLIB_ALGORITHMS)]
