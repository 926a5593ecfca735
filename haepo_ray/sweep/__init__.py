"""``haepo sweep``: YAML sweep specs (``tune_configs/``) -> validated model -> ``ray.tune.Tuner``.

- :mod:`haepo_ray.sweep.spec`: the spec format and :func:`~haepo_ray.sweep.spec.load_spec`;
- :mod:`haepo_ray.sweep.tuner`: spec -> Tuner; run, resume, dry-run, best-trial summary;
- :mod:`haepo_ray.sweep.trainable`: the trial's trainable (reusable for many trials, the
  sweep's metric in every result);
- :mod:`haepo_ray.sweep.cli`: the ``haepo sweep`` sub-command (wired into :mod:`haepo_ray.cli`).

MLflow tracking (parent run per sweep, child run per trial) is :mod:`haepo_ray.tracking`.
"""
