"""RL trials: an RLlib algorithm (HAEPO, its baselines, PPO, ...) on an env per trial.

:mod:`~haepo_ray.sweep.kinds.rl.spec` its keys (``algorithm``, ``env``, ``env_config``),
:mod:`~haepo_ray.sweep.kinds.rl.plan` the spec resolved against RLlib,
:mod:`~haepo_ray.sweep.kinds.rl.trainable` the Tune trainable that runs the algorithm.
"""
