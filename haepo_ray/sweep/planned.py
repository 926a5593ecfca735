"""The trials a sweep will run, as Tune will generate them from the plan's ``param_space``:
:func:`planned_trials` (``haepo sweep --dry-run`` prints them; the language-model plan
estimates their memory before launch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from haepo_ray.sweep.plan_base import Plan

__all__ = ["PlannedTrial", "planned_trials"]


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
    from ray.tune.search.variant_generator import generate_variants

    from haepo_ray.upstream.tune import variant_rng

    # What BasicVariantGenerator does: the whole config, in its order, one random state.
    rng = variant_rng(spec.search.seed)
    keys = {name: plan.search_keys[name] for name in spec.search_space}
    trials: list[PlannedTrial] = []
    for _ in range(spec.search.num_samples):
        for _, resolved in generate_variants({"config": plan.param_space}, random_state=rng):
            values = {name: resolved["config"][key] for name, key in keys.items()}
            trials.append(PlannedTrial(len(trials), values))
    return trials
