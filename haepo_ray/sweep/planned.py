"""The trials a sweep will run, as Tune will generate them from the plan's ``param_space``:
:func:`planned_trials` (``haepo sweep --dry-run`` prints them; the language-model plan
estimates their memory before launch), and :func:`checked_trials`, each one's config checked
(``haepo sweep`` refuses a bad one before Ray starts, not as a trial that fails)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from haepo_ray.sweep.plan_base import Plan

__all__ = ["PlannedTrial", "checked_trials", "planned_trials"]

SHOWN_ERRORS = 10  # bad trials named one by one; the rest counted


@dataclass
class PlannedTrial:
    index: int
    values: dict[str, Any]  # spec search-space name -> value


def planned_trials(plan: Plan) -> list[PlannedTrial] | None:
    """The trials a grid/random search will run, as Tune will generate them (None for
    Optuna: it suggests as it goes). Random draws are reproduced exactly when
    ``search.seed`` is set; without it they are examples."""
    spec = plan.spec
    if spec.search.algorithm == "optuna":
        return None
    import numpy as np
    from ray.tune.search.variant_generator import generate_variants

    from haepo_ray.upstream.tune import variant_rng

    # What BasicVariantGenerator does: the whole config, in its order, one random state (without
    # a seed, a state of its own: not numpy's global one, which Tune's own draws then use).
    rng = variant_rng(spec.search.seed if spec.search.seed is not None else np.random.default_rng())
    keys = {name: plan.search_keys[name] for name in spec.search_space}
    trials: list[PlannedTrial] = []
    for _ in range(spec.search.num_samples):
        for _, resolved in generate_variants({"config": plan.param_space}, random_state=rng):
            values = {name: resolved["config"][key] for name, key in keys.items()}
            trials.append(PlannedTrial(len(trials), values))
    return trials


def checked_trials(plan: Plan) -> list[PlannedTrial] | None:
    """:func:`planned_trials`, once each one's config is made and checked; a SpecError names
    every trial that is wrong, and why."""
    from haepo_ray.sweep.spec import SpecError

    trials = planned_trials(plan)
    errors = []
    for t in trials or []:
        try:
            plan.trial_config(t.values)
        except SpecError as err:
            errors.append(f"{plan.spec.source or '<spec>'}: trial {t.index} {t.values}: {err}")
    if errors:
        more = len(errors) - SHOWN_ERRORS
        raise SpecError("\n".join(errors[:SHOWN_ERRORS] + ([f"... and {more} more trials"] if more > 0 else [])))
    return trials
