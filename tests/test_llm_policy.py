"""The memory savers of a language-model run (haepo_ray.llm.policy) on real tensors: gradient
checkpointing recomputes and changes no gradient; LoRA trains only its adapter, holds one copy
of the base weights, and its reference is the model with the adapter switched off."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from haepo_ray.llm.objectives import group_loss
from haepo_ray.llm.lora import adapter_problem
from haepo_ray.llm.policy import Policy
from haepo_ray.llm.rollout import sample_completions, token_stats
from haepo_ray.llm.settings import LLMTrainSettings
from helpers import RETURNS, group_batch


def _settings(algo: str = "HAEPO", **savers) -> LLMTrainSettings:
    return LLMTrainSettings(algo=algo, model="tiny", dtype="float64", lr=1e-2, sft_lr=1e-2, micro_batch_size=0,
                            **savers)


def _rl_policy(model, settings: LLMTrainSettings) -> Policy:
    policy = Policy(copy.deepcopy(model), settings)
    policy.start_sft()
    policy.start_rl()
    return policy


def _layer_runs(model) -> list[int]:
    """Runs of the decoder layers' first norm. A checkpointed layer's recomputation calls its
    forward directly (no hook of the layer fires) and stops once the saved tensors are rebuilt
    (a sub-module's post-forward hook may not fire): a pre-hook of its first sub-module counts."""
    calls = [0]
    for layer in model.model.layers:
        layer.input_layernorm.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("algo", ["HAEPO", "GRPO", "DPO"])
def test_gradient_checkpointing_recomputes_and_leaves_the_gradients_unchanged(tiny_lm, algo):
    model, tokenizer = tiny_lm
    batch = group_batch(tokenizer)
    grads, calls = [], []
    for checkpointing in (False, True):
        policy = _rl_policy(model, _settings(algo, gradient_checkpointing=checkpointing))
        with torch.no_grad():
            ref = token_stats(model, batch)[0] * 1.1
        loss_fn = group_loss(policy.settings.objective(), batch, RETURNS[algo], ref, group_rows=3)
        calls.append(_layer_runs(policy.model))
        policy.gradients(batch, loss_fn)
        grads.append(torch.cat([p.grad.flatten() for p in policy.model.parameters()]))
    assert grads[0].abs().max() > 1e-4
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-10, atol=0)
    layers = len(model.model.layers)
    assert calls[0] == [layers] and calls[1] == [2 * layers]  # each layer's forward runs again in the backward


def test_checkpointed_layers_are_in_training_mode_only_in_passes_with_gradient(tiny_lm):
    """transformers 5.17 drops the KV cache in a checkpointed layer in training mode (its
    generation then attends to the newest token alone): outside the passes with gradient the
    layers are in eval mode, and greedy generation is the same with checkpointing as without."""
    model, tokenizer = tiny_lm
    batch = group_batch(tokenizer)
    policy = _rl_policy(model, _settings(gradient_checkpointing=True))
    first = policy.model.model.layers[0]
    seen: list[bool] = []
    first.input_layernorm.register_forward_pre_hook(lambda *_: seen.append(first.training))
    policy.logp(batch)
    assert seen == [False]
    loss_fn = group_loss(policy.settings.objective(), batch, RETURNS["HAEPO"], policy.reference_logp(batch),
                         group_rows=3)
    policy.gradients(batch, loss_fn)
    assert seen == [False, True, True]  # the forward, and its recomputation in the backward
    assert not any(layer.training for layer in policy.model.model.layers)
    plain = _rl_policy(model, _settings())
    prompt = batch.input_ids[:1, :4]
    tokens = [sample_completions(p.model, prompt, torch.ones_like(prompt), eos_token_id=[-1],
                                 pad_token_id=0, max_new_tokens=6, greedy=True) for p in (plain, policy)]
    torch.testing.assert_close(tokens[1], tokens[0], rtol=0, atol=0)


def test_lora_trains_only_its_adapter_and_refers_to_the_weights_without_it(tiny_lm):
    model, tokenizer = tiny_lm
    batch = group_batch(tokenizer)
    settings = _settings(lora_r=2)
    policy = Policy(copy.deepcopy(model), settings)
    policy.start_sft()
    policy.sft_step(batch, int(batch.completion_mask.sum()))
    policy.start_rl()  # SFT's adapter merged into the weights; a fresh adapter for RL
    base = policy.model.get_base_model()
    sft_weights = {name: p.detach().clone() for name, p in base.named_parameters() if "lora_" not in name}
    assert not torch.equal(sft_weights["model.layers.0.self_attn.q_proj.base_layer.weight"],
                           dict(model.named_parameters())["model.layers.0.self_attn.q_proj.weight"])
    assert all("lora_" in name for name, p in policy.model.named_parameters() if p.requires_grad)

    ref_before = policy.reference_logp(batch)
    loss_fn = group_loss(settings.objective(), batch, RETURNS["HAEPO"], ref_before, group_rows=3)
    adapters = {name: p.detach().clone() for name, p in policy.model.named_parameters() if p.requires_grad}
    for _ in range(2):
        policy.update(batch, loss_fn)
    for name, p in base.named_parameters():
        if "lora_" in name:
            continue
        assert torch.equal(p, sft_weights[name]), name  # the base weights never train
    assert all(not torch.equal(p, adapters[name]) for name, p in policy.model.named_parameters() if p.requires_grad)
    with torch.no_grad():
        policy_logp = token_stats(policy.model, batch)[0]
    assert not torch.allclose(policy_logp, ref_before)  # the adapter changed the policy ...
    torch.testing.assert_close(policy.reference_logp(batch), ref_before, rtol=0, atol=0)  # ... not the reference
    # One copy of the base weights: the reference is the same model, its adapter switched off.
    assert policy.reference is None
    storages = {p.untyped_storage().data_ptr() for _, p in policy.model.named_parameters()}
    assert len(storages) == len(list(policy.model.parameters()))


@pytest.mark.parametrize("lora_r", [0, 2])
def test_exact_kl_to_the_reference_is_zero_at_the_start_and_the_vocabulary_sum_after_a_change(tiny_lm, lora_r):
    """The reference is a frozen copy (no LoRA) or the model with its adapter off (LoRA): at the
    start of RL the policy is its reference (KL 0); once the trained weights move, each
    completion's exact KL is the sum over its positions of the per-token KL between the policy's
    and the reference's next-token distributions."""
    from haepo_ray.llm.rollout import completion_logits, token_kl

    model, tokenizer = tiny_lm
    batch = group_batch(tokenizer)
    policy = _rl_policy(model, dataclasses.replace(_settings(lora_r=lora_r), micro_batch_size=2))
    assert torch.equal(policy.exact_kl(batch), torch.zeros(len(batch), dtype=torch.float64))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in policy.trainable():
            p.add_(0.5 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
        if lora_r:  # the reference: the same weights without the adapter
            assert policy.reference is None
            with policy.model.disable_adapter():
                ref_logits = completion_logits(policy.model, batch)
        else:
            ref_logits = completion_logits(policy.reference, batch)
        expected = token_kl(completion_logits(policy.model, batch), ref_logits, batch.completion_mask).sum(1)
    got = policy.exact_kl(batch)
    assert (got > 0).all()
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)
    assert torch.equal(_rl_policy(model, _settings(reference="none", beta_kl=0.0)).exact_kl(batch),
                       torch.zeros(len(batch), dtype=torch.float64))


def test_a_lora_target_is_refused_exactly_where_peft_alone_would_adapt_nothing(tiny_lm):
    """adapter_problem's premise, on the real peft: given several targets, peft adapts those it
    finds and skips a mistyped one without a word; alone, a target is refused by peft exactly
    where adapter_problem refuses it (each module name's last part, a path, none)."""
    from peft import LoraConfig, get_peft_model

    model, _ = tiny_lm

    def peft_adapts(targets: list[str]) -> list[str]:
        try:
            adapted = get_peft_model(copy.deepcopy(model), LoraConfig(r=1, target_modules=targets))
        except ValueError:
            return []
        return adapted.targeted_module_names

    assert {name.rsplit(".", 1)[-1] for name in peft_adapts(["q_proj", "v_projj"])} == {"q_proj"}
    assert "'v_projj' names no module" in adapter_problem(model.config, ["q_proj", "v_projj"])
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules() if name} | {"layers.1.mlp.up_proj", "x"}
    for target in sorted(names):
        assert (adapter_problem(model.config, [target]) is None) == bool(peft_adapts([target])), target
    assert adapter_problem(model.config, ["q_proj", "v_proj"]) is None
