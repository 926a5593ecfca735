"""``haepo sweep``: a YAML sweep spec (``tune_configs/``) -> a resolved plan -> Ray Tune.

Data flows one way through these modules:

- :mod:`~haepo_ray.sweep.spec`: the spec format every kind shares, validated (pure schema, no Ray);
- :mod:`~haepo_ray.sweep.idle_scheduler`: whether the spec's scheduler would act before the trials end;
- :mod:`~haepo_ray.sweep.kinds`: the kinds of trial, a package each (``rl``: RLlib algorithms
  on envs; ``llm``: language models), each with its spec keys, its
  :class:`~haepo_ray.sweep.plan_base.Plan` (param space, search keys, trial configs and
  resources, trainable, step key, metrics, what MLflow tags) and its trainable; a spec is
  read and resolved once, by its kind;
- :mod:`~haepo_ray.sweep.tune_setup`: the Tune objects (searcher, scheduler, configs);
- :mod:`~haepo_ray.sweep.runner`: Ray start-up, tracking, run or resume, in the folders of
  :mod:`~haepo_ray.sweep.paths`;
- :mod:`~haepo_ray.sweep.interrupt`: whether Ctrl-C stopped the sweep, and its trials' statuses then;
- :mod:`~haepo_ray.sweep.metric_watch`: a metric no trial reports (a misspelt one), said early;
- :mod:`~haepo_ray.sweep.results`: trial summaries, the best-trial rule, the printed summary;
- :mod:`~haepo_ray.sweep.dry_run`: every planned trial, printed, nothing run.

The ``haepo sweep`` command line is :mod:`haepo_ray.cli.sweep`; MLflow tracking (parent run
per sweep, child run per trial) is :mod:`haepo_ray.tracking`.
"""
