"""Whether a spec's scheduler would ever act: Tune asks it about every result but the one that
meets a stop criterion, so an ASHA that first compares trials, or a PBT that first exploits, at or
after the iteration that ends every trial never acts, and the sweep is a FIFO sweep that says it
is not (:func:`idle_scheduler`; the RL spec's ``stop.iterations``, a language-model sweep's
``rl_updates``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from haepo_ray.sweep.spec import ASHAScheduler, FIFOScheduler, PBTScheduler

__all__ = ["idle_scheduler"]

# A scheduler's type -> the key of the iteration of its first decision, and what it then does.
_FIRST_DECISION = {"asha": ("grace_period", "compares trials"), "pbt": ("perturbation_interval", "exploits")}


def idle_scheduler(scheduler: FIFOScheduler | ASHAScheduler | PBTScheduler, last: int, ends: str,
                   why: str) -> str | None:
    """Why ``scheduler`` would never act on
    trials whose last result comes at iteration ``last`` (set by ``ends``; ``why`` it cannot act
    there), or None: ASHA first compares trials at ``grace_period`` iterations, PBT first exploits
    at ``perturbation_interval``."""
    key, what = _FIRST_DECISION.get(scheduler.type, (None, None))
    if key is None or last > getattr(scheduler, key):
        return None
    return (f"scheduler {scheduler.type} would never act: it first {what} at scheduler.{key} "
            f"({getattr(scheduler, key)}) iterations, and {ends} ({last}) ends every trial by then ({why}): "
            + (f"lower scheduler.{key} below {last}, or raise {ends}" if last > 1 else f"raise {ends}"))
