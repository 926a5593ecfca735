"""Language-model trials: a causal LM fine-tuned by HAEPO, GRPO or DPO per trial.

:mod:`~haepo_ray.sweep.kinds.llm.spec` its keys (``llm``),
:mod:`~haepo_ray.sweep.kinds.llm.plan` the spec resolved (settings, methods, SFT starts),
:mod:`~haepo_ray.sweep.kinds.llm.methods` an algorithm with settings of its own,
:mod:`~haepo_ray.sweep.kinds.llm.config` a trial's config,
:mod:`~haepo_ray.sweep.kinds.llm.fit` the trials held to their GPU's memory,
:mod:`~haepo_ray.sweep.kinds.llm.trainable` the Ray Train trial that runs :mod:`haepo_ray.llm`.
"""
