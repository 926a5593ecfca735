"""The paper's language-model experiment: HAEPO, GRPO and DPO fine-tuning a causal LM on summaries.

Rooms: :mod:`~haepo_ray.llm.data` (ACLSum, TL;DR, prompts, the SFT/RL split),
:mod:`~haepo_ray.llm.models` (Hub name or path, SmolLM2 offline, the tiny test model),
:mod:`~haepo_ray.llm.rollout` (completions, masks, L_k), :mod:`~haepo_ray.llm.rewards`
(the paper's reward, the metrics), :mod:`~haepo_ray.llm.objectives` (the three losses on LM
groups, the exact micro-batched backward), :mod:`~haepo_ray.llm.policy` (the model, its
reference and optimiser, the memory savers), :mod:`~haepo_ray.llm.memory` (measured peak
memory per phase), :mod:`~haepo_ray.llm.capacity` (a trial's GPU memory and time, simulated
before launch), :mod:`~haepo_ray.llm.settings` (a run's settings),
:mod:`~haepo_ray.llm.distributed` (W workers train what one does), :mod:`~haepo_ray.llm.train`
(the loop and its output files), and the human-evaluation form (:mod:`~haepo_ray.llm.eval_form`, ``eval_page``,
``eval_score``); their command lines, ``haepo llm ...``, are :mod:`haepo_ray.cli.llm` and
:mod:`haepo_ray.cli.llm_eval`. Nothing here imports Ray; transformers loads on first use.
"""
