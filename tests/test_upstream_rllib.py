"""The RLlib patch changes nothing but cost: the same frames, the same recorded connector
arguments; the sweep's trainable installs it, building ``HAEPO`` as a library does not."""

from __future__ import annotations

import inspect

from haepo_ray.upstream import rllib as rllib_internals
from haepo_ray.rl.algorithm import HAEPOConfig


def _frames_both_ways():
    return inspect.stack(), rllib_internals.caller_frames()  # one line: the same line number


def test_caller_frames_are_inspect_stacks_frames():
    full, cheap = _frames_both_ways()
    assert len(cheap) == len(full) > 3
    assert [(f.frame, f.function, f.lineno) for f in cheap] == [(f.frame, f.function, f.lineno) for f in full]
    assert cheap[0].function == "_frames_both_ways" and cheap[1].function == inspect.stack()[0].function


def _connector_args(algo) -> dict[str, str]:
    """Every connector piece of the local env runner and learner: its recorded constructor
    arguments (what a checkpoint restores it from)."""
    pipelines = [algo.env_runner._env_to_module, algo.env_runner._module_to_env,
                 algo.learner_group._learner._learner_connector]
    args = {}
    for pipeline in pipelines:
        for piece in pipeline.connectors:
            args[f"{type(pipeline).__name__}/{type(piece).__name__}"] = repr(piece.get_ctor_args_and_kwargs())
    return args


def test_connectors_record_the_same_arguments_with_and_without_the_patch(ray_session, monkeypatch):
    from ray.rllib.connectors import connector_v2

    config = (HAEPOConfig().environment("haepo/ChainMDP-v0").env_runners(num_env_runners=0)
              .training(episodes_per_batch=4).rl_module(model_config={"fcnet_hiddens": [8]}))
    monkeypatch.setattr(connector_v2, "inspect", inspect)
    unpatched = config.build_algo()
    assert connector_v2.inspect is inspect  # building HAEPO as a library patches nothing
    assert rllib_internals.CONNECTORS_WITHOUT_SOURCE.apply()
    patched = config.build_algo()
    try:
        assert isinstance(connector_v2.inspect, rllib_internals.InspectWithoutSource)
        expected = _connector_args(unpatched)
        assert len(expected) >= 8
        assert _connector_args(patched) == expected
        assert any("_ctor_kwargs" in vars(piece) and vars(piece)["_ctor_kwargs"]
                   for piece in patched.env_runner._env_to_module.connectors + patched.env_runner._module_to_env.connectors
                   + patched.learner_group._learner._learner_connector.connectors)
    finally:
        unpatched.stop()
        patched.stop()
