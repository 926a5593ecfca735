"""Helpers that several test modules share (imported as ``helpers``: pytest puts tests/ on the path)."""

from __future__ import annotations

import torch

# Two prompts of three completions each: the groups of an LM update.
PROMPTS = ["the model writes", "the model writes", "the model writes",
           "we propose a method", "we propose a method", "we propose a method"]
COMPLETIONS = ["a short summary", "the paper", "results show the method improves accuracy",
               "for parsing", "a cat sat on the mat", "the method"]
RETURNS = {
    "HAEPO": torch.tensor([0.3, 0.9, 0.1, 0.5, 0.2, 0.7], dtype=torch.float64),
    "GRPO": torch.tensor([0.3, 0.9, 0.1, 0.5, 0.2, 0.7], dtype=torch.float64),
    "DPO": torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0], dtype=torch.float64),  # gold first, then samples
}


def group_batch(tokenizer):
    """:data:`COMPLETIONS` after :data:`PROMPTS` as one update's batch of two groups of three."""
    from haepo_ray.llm.rollout import completion_batch

    batch = completion_batch(tokenizer, PROMPTS, COMPLETIONS)
    return type(batch)(batch.input_ids, batch.attention_mask, batch.completion_mask,
                       torch.tensor([0, 0, 0, 1, 1, 1]))
