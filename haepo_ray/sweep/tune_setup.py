"""The Ray Tune objects of a sweep, built from its :class:`~haepo_ray.sweep.plan_base.Plan`:
search algorithm, scheduler, ``TuneConfig``, ``RunConfig`` and the live trial table."""

from __future__ import annotations

from haepo_ray.sweep.plan_base import Plan


def search_algorithm(plan: Plan):
    """Optuna TPE, or Tune's grid/random variant generator (seeded by ``search.seed``)."""
    from ray.tune.search.basic_variant import BasicVariantGenerator

    spec = plan.spec
    if spec.search.algorithm == "optuna":
        import optuna
        from ray.tune.search import ConcurrencyLimiter
        from ray.tune.search.optuna import OptunaSearch

        searcher = OptunaSearch(sampler=optuna.samplers.TPESampler(seed=spec.search.seed))
        if spec.max_concurrent_trials:
            return ConcurrencyLimiter(searcher, max_concurrent=spec.max_concurrent_trials)
        return searcher
    return BasicVariantGenerator(random_state=spec.search.seed,
                                 max_concurrent=spec.max_concurrent_trials or 0)


class TrialNamer:
    """``<algorithm>_<env>_<trial id>`` (Tune's own format, whichever trainable runs it);
    ``llm_<model>_<trial id>`` in a language-model sweep over algorithms."""

    def __init__(self, algorithm: str | None, label: str):
        self.prefix = "_".join(p for p in (algorithm, label) if p).replace("/", "_")

    def __call__(self, trial) -> str:
        return f"{self.prefix}_{trial.trial_id}"


def scheduler(plan: Plan):
    """FIFO, ASHA or Population Based Training over training iterations."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, PopulationBasedTraining

    s = plan.spec.scheduler
    if s.type == "asha":
        return ASHAScheduler(time_attr=plan.step_key, max_t=s.max_t,
                             grace_period=s.grace_period, reduction_factor=s.reduction_factor)
    if s.type == "pbt":
        import random

        if s.seed is not None:  # PBT draws with the module-level `random`
            random.seed(s.seed)
        return PopulationBasedTraining(
            time_attr=plan.step_key,
            perturbation_interval=s.perturbation_interval,
            hyperparam_mutations=plan.mutations,
            quantile_fraction=s.quantile_fraction,
            resample_probability=s.resample_probability,
            synch=s.synch,
        )
    return FIFOScheduler()


def tune_config(plan: Plan):
    from ray import tune

    spec = plan.spec
    return tune.TuneConfig(
        metric=spec.metric,
        mode=spec.mode,
        num_samples=spec.search.num_samples,
        search_alg=search_algorithm(plan),
        scheduler=scheduler(plan),
        reuse_actors=spec.reuse_actors,
        trial_name_creator=TrialNamer(spec.algorithm, plan.label),
    )


def progress_reporter(plan: Plan):
    """The live trial table: search values, iteration, time, env steps, the metric."""
    from ray import tune

    metrics = dict(plan.progress_metrics)
    metrics.setdefault(plan.spec.metric, plan.spec.metric.rsplit("/", 1)[-1])
    return tune.CLIReporter(
        metric_columns=metrics,
        parameter_columns={key: name for name, key in plan.search_keys.items()},
        max_report_frequency=10,
        max_progress_rows=20,
        sort_by_metric=True,
    )


def run_config(plan: Plan, *, storage_path: str, name: str, callbacks: list, verbose: int = 1):
    from ray import tune

    spec = plan.spec
    return tune.RunConfig(
        progress_reporter=progress_reporter(plan),
        name=name,
        storage_path=storage_path,
        stop=plan.stop_dict(),
        callbacks=callbacks,
        checkpoint_config=tune.CheckpointConfig(  # (trials that checkpoint themselves keep their own)
            checkpoint_frequency=spec.checkpoint_frequency if plan.tune_checkpoints else 0,
            checkpoint_at_end=spec.checkpoint_at_end and plan.tune_checkpoints,
            num_to_keep=spec.keep_checkpoints,
        ),
        failure_config=tune.FailureConfig(max_failures=spec.max_failures),
        verbose=verbose,
    )
