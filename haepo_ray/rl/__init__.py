"""HAEPO as an RLlib algorithm (new API stack), in one package as RLlib keeps each of its
algorithms: the config and algorithm (:mod:`~haepo_ray.rl.algorithm`), the learner
(:mod:`~haepo_ray.rl.learner`) with its connector, the env runner with its
:mod:`~haepo_ray.rl.sampling` pieces, the training metrics and schedules, the algorithm names
(:mod:`~haepo_ray.rl.registry`), the config builder (:mod:`~haepo_ray.rl.configs`) and the
paper's baselines (:mod:`~haepo_ray.rl.baselines`). The loss itself is shared with the
language-model experiment and lives beside it: :mod:`haepo_ray.loss`, :mod:`haepo_ray.listwise`,
:mod:`haepo_ray.baseline_losses`. ``from haepo_ray import HAEPOConfig`` is the public import.
"""
