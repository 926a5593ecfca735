"""Where tensors live: observation dtypes in the lean sampler, the reference policy on the
learner's device, and what travels with the weights vs. in checkpoints.

The GPU variants run only where CUDA is available (skipped otherwise)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from haepo_ray.rl.algorithm import HAEPOConfig
from haepo_ray.rl.learner import REFERENCE_STATE

CHAIN = "haepo/ChainMDP-v0"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class ByteObservationEnv(gym.Env):
    """uint8 observations (as images are), three steps, reward = action."""

    observation_space = gym.spaces.Box(0, 255, (2,), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.integers(0, 256, 2, dtype=np.uint8), {}

    def step(self, action):
        self.t += 1
        obs = self.np_random.integers(0, 256, 2, dtype=np.uint8)
        return obs, float(action), self.t >= 3, False, {}


def _byte_scaling_module() -> type:
    from ray.rllib.algorithms.bc.torch.default_bc_torch_rl_module import DefaultBCTorchRLModule
    from ray.rllib.core.columns import Columns

    class ScalesBytes(DefaultBCTorchRLModule):
        """Scales uint8 observations to [0, 1], as image models do; other dtypes pass."""

        def _forward(self, batch, **kwargs):
            obs = batch[Columns.OBS]
            if obs.dtype == torch.uint8:
                batch = {**batch, Columns.OBS: obs.float() / 255.0}
            return super()._forward(batch, **kwargs)

    return ScalesBytes


def test_uint8_observations_score_alike_in_sampler_and_learner(ray_session):
    """The lean sampler converts observations as RLlib's connectors do (uint8 stays uint8),
    so the module scores a batch the same when sampling and when learning."""
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.tune.registry import register_env

    register_env("test/ByteObservation-v0", lambda cfg: ByteObservationEnv())
    config = (
        HAEPOConfig().environment("test/ByteObservation-v0")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=2)
        .rl_module(rl_module_spec=RLModuleSpec(module_class=_byte_scaling_module()),
                   model_config={"fcnet_hiddens": [8]})
        .training(episodes_per_batch=4, num_epochs=1)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    try:
        assert algo.env_runner_group.local_env_runner.lean_path_blocker() is None
        results = [algo.train() for _ in range(2)]
    finally:
        algo.stop()
    for result in results:
        # L_k of the learner's first gradient step == the sampler's sum of log-probs.
        assert result["learners"]["default_policy"]["behavior_logp_gap"] < 1e-5


def _chain_config() -> HAEPOConfig:
    return (
        HAEPOConfig().environment(CHAIN)
        .training(episodes_per_batch=8, lr=0.05, reference_update_interval=2)
        .rl_module(model_config={"fcnet_hiddens": [16]})
        .debugging(seed=0)
    )


def _reference(algo) -> dict[str, np.ndarray]:
    state = algo.learner_group.get_state()["learner"][REFERENCE_STATE]
    return {k: np.array(v) for k, v in state["modules"]["default_policy"].items()}


def test_weight_sync_leaves_the_reference_out_and_checkpoints_keep_it(ray_session, tmp_path):
    from ray.rllib.algorithms.algorithm import Algorithm
    from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE

    algo = _chain_config().build_algo()
    try:
        for _ in range(3):  # the reference is refreshed at iteration 2: not the initial policy
            algo.train()
        # What EnvRunnerGroup.sync_weights asks the learner group for, every iteration.
        synced = algo.learner_group.get_state(
            components=[f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}"], inference_only=True
        )[COMPONENT_LEARNER]
        assert COMPONENT_RL_MODULE in synced and REFERENCE_STATE not in synced
        reference = _reference(algo)
        algo.save_to_path(str(tmp_path / "ckpt"))
    finally:
        algo.stop()
    restored = Algorithm.from_checkpoint(str(tmp_path / "ckpt"))
    try:
        restored_reference = _reference(restored)
    finally:
        restored.stop()
    assert reference.keys() == restored_reference.keys()
    for name in reference:
        np.testing.assert_array_equal(restored_reference[name], reference[name])


@needs_cuda
def test_gpu_learner_keeps_the_reference_on_its_device_and_checkpoints_move(ray_session, tmp_path):
    """Train on a GPU learner, restore the checkpoint on CPU and back on the GPU."""
    paths, references = {}, {}
    for device, gpus in (("cuda", 1), ("cpu", 0), ("cuda-again", 1)):
        algo = _chain_config().learners(num_learners=0, num_gpus_per_learner=gpus).build_algo()
        try:
            if paths:
                algo.restore_from_path(paths[list(paths)[-1]])
                previous = references[list(references)[-1]]
                for name, value in _reference(algo).items():
                    np.testing.assert_array_equal(value, previous[name])
            algo.train()
            learner = algo.learner_group._learner
            ref_device = next(learner._reference["default_policy"].parameters()).device
            assert ref_device == learner._device, (ref_device, learner._device)
            assert ref_device.type == ("cuda" if gpus else "cpu")
            references[device] = _reference(algo)
            paths[device] = str(tmp_path / device)
            algo.save_to_path(paths[device])
        finally:
            algo.stop()


@needs_cuda
def test_lean_sampling_on_a_gpu_env_runner_with_a_fractional_gpu_learner(ray_session):
    """A remote env runner whose module sits on a GPU samples on the lean path; the learner,
    on half a GPU, scores the batch as the sampler did."""
    config = (
        _chain_config()
        .env_runners(num_env_runners=1, num_envs_per_env_runner=4, num_gpus_per_env_runner=0.5)
        .learners(num_learners=0, num_gpus_per_learner=0.5)
        .training(num_epochs=1)
    )
    algo = config.build_algo()
    try:
        runner_state = algo.env_runner_group.foreach_env_runner(
            lambda runner: (str(next(runner.module.parameters()).device), runner.lean_path_blocker()),
            local_env_runner=False,
        )
        assert runner_state == [("cuda:0", None)]
        result = algo.train()
    finally:
        algo.stop()
    assert result["learners"]["default_policy"]["behavior_logp_gap"] < 1e-4
    assert result["env_runners"]["num_episodes"] == 8
