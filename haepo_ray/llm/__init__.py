"""The paper's language-model experiment: HAEPO, GRPO and DPO fine-tuning a causal LM on summaries.

Rooms: :mod:`~haepo_ray.llm.data` (ACLSum, TL;DR, prompts, the SFT/RL split),
:mod:`~haepo_ray.llm.models` (Hub name or path, SmolLM2 offline, the tiny test model),
:mod:`~haepo_ray.llm.rollout` (completions, masks, L_k), :mod:`~haepo_ray.llm.rewards`
(the paper's reward, the metrics), :mod:`~haepo_ray.llm.objectives` (the three losses on LM
groups, the exact micro-batched backward), :mod:`~haepo_ray.llm.memory` (peak memory per
phase), :mod:`~haepo_ray.llm.train` (the loop and its output files), :mod:`~haepo_ray.llm.cli`
(``haepo llm train``). Nothing here imports Ray; transformers loads on first use.
"""
