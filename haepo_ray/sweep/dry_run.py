"""``haepo sweep --dry-run``: every trial a sweep would run, with its values and resources;
nothing starts."""

from __future__ import annotations

import sys
from typing import TextIO

from haepo_ray.sweep.cluster import Cluster
from haepo_ray.sweep.paths import check_root, experiment_root
from haepo_ray.sweep.plan_base import Plan
from haepo_ray.sweep.planned import PlannedTrial, checked_trials
from haepo_ray.sweep.spec import SpecError
from haepo_ray.tables import format_table


def dry_run(plan: Plan, *, out: TextIO | None = None, experiment: str | None = None,
            storage_path: str | None = None, tracking_uri: str | None = None,
            address: str | None = None) -> list[PlannedTrial] | None:
    """Prints the resolved sweep (every trial with its values and resources); starts nothing.
    Every planned trial's config is validated; bad ones raise SpecError naming each. The
    sweep's patches are checked as a run checks them (:func:`haepo_ray.upstream.check`).
    ``out``: ``sys.stdout`` at the time of the call by default."""
    from haepo_ray import upstream
    from haepo_ray.tracking import resolve_tracking_uri

    untested = upstream.check(plan.patched)
    spec = plan.spec
    root = experiment_root(spec, experiment, storage_path)
    try:
        check_root(root)
        uri = resolve_tracking_uri(tracking_uri, create=False)
    except ValueError as err:  # a results folder that cannot be written, a store MLflow does not have
        raise SpecError(str(err)) from None
    trials = checked_trials(plan)  # before anything builds a trial's config (resources do)
    plan = plan.fitted(Cluster.unknown())  # refuses language-model trials that cannot fit their GPUs
    out = out or sys.stdout
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(f"sweep {spec.source or spec.experiment}: {plan.title}")
    p(f"  search: {spec.search.algorithm}, num_samples {spec.search.num_samples}"
      + (f", seed {spec.search.seed}" if spec.search.seed is not None else ""))
    sched = spec.scheduler.model_dump(mode="json")
    if "mutations" in sched:
        sched["mutations"] = {k: f"{d['kind']} {d['values']}" for k, d in sched["mutations"].items()}
    p(f"  scheduler: {sched}")
    p(f"  metric: {spec.metric} ({spec.mode});  stop: {plan.stop_dict()}")
    p(f"  per trial: {plan.trial_resources(trials[0].values if trials else {})};  "
      f"max concurrent: {spec.max_concurrent_trials or 'as resources allow'};  "
      f"retries: {spec.max_failures};  checkpoint every {spec.checkpoint_frequency or '-'} "
      f"{plan.step_name}{', and at the end' if spec.checkpoint_at_end else ''}")
    p(f"  Ray: {address or 'embedded local Ray'};  results: "
      f"{root}/<run>")
    p(f"  MLflow: {uri} (experiment "
      f"{experiment or spec.experiment!r})")
    if plan.fit_summary:
        p(f"  {plan.fit_summary}")
    for line in untested:
        p(f"  {line}")
    if trials is None:
        p(f"  {spec.search.num_samples} trials suggested by Optuna TPE from:")
        for name, dim in spec.search_space.items():
            p(f"    {name}: {dim.describe()}")
        return None
    value_names = list(spec.search_space)
    random = any(d.kind != "grid" for d in spec.search_space.values())
    p(f"  {len(trials)} trials" + (" (random draws: examples, set search.seed to fix them)"
                                   if random and spec.search.seed is None else "") + ":")
    columns = [plan.trial_columns(t.values) for t in trials]
    extra = list(columns[0]) if columns else []
    p(format_table(["trial"] + value_names + extra,
                   [[t.index] + [t.values[n] for n in value_names] + list(c.values()) for t, c in zip(trials, columns)]))
    return trials
