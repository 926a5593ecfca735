"""``haepo sweep``: a YAML sweep spec (``tune_configs/``) -> a resolved plan -> Ray Tune.

Data flows one way through these modules:

- :mod:`~haepo_ray.sweep.spec`: the spec format, validated (pure schema, no Ray);
- :mod:`~haepo_ray.sweep.plan`: :class:`~haepo_ray.sweep.plan.SweepPlan`, the spec resolved
  once against RLlib (configs, search keys, param space, mutations, trainable);
- :mod:`~haepo_ray.sweep.tune_setup`: the Tune objects (searcher, scheduler, configs);
- :mod:`~haepo_ray.sweep.runner`: Ray start-up, the sweep's folder, tracking, run or resume;
- :mod:`~haepo_ray.sweep.trainable`: the trial's trainable (reusable, the metric in every result);
- :mod:`~haepo_ray.sweep.results`: trial summaries, the best-trial rule, the printed summary;
- :mod:`~haepo_ray.sweep.dry_run`: every planned trial, printed, nothing run.

The ``haepo sweep`` command line is :mod:`haepo_ray.cli.sweep`; MLflow tracking (parent run
per sweep, child run per trial) is :mod:`haepo_ray.tracking`.
"""
