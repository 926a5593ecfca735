"""HAEPOEnvRunner: RLlib's SingleAgentEnvRunner, seeded once and with its random state checkpointed.

RLlib 2.60's ``sample(num_episodes=n)`` re-seeds every env with the configured seed on
each call, so with ``config.debugging(seed=...)`` every batch would start from the same
initial states and draw the same env noise. This runner seeds its envs only at the first
reset; later resets continue each env's own random stream. Its state (and so an
Algorithm checkpoint) also holds the random state of its envs and of PyTorch's sampler,
so a restored algorithm with one env runner (``num_env_runners=0``) continues exactly as
the original would have; with remote runners, the runner whose state was saved takes it
back and the others keep their own seeded streams.
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

RNG_STATE = "haepo_rng_state"


class HAEPOEnvRunner(SingleAgentEnvRunner):
    """A SingleAgentEnvRunner that seeds its envs once and checkpoints its random state."""

    def sample(self, *args: Any, **kwargs: Any):
        episodes = super().sample(*args, **kwargs)
        self._seed = None  # the envs are seeded; later resets continue their streams
        return episodes

    def _sub_envs(self) -> list | None:
        envs = getattr(getattr(self.env, "unwrapped", None), "envs", None)
        return list(envs) if envs is not None else None  # None for async vector envs

    def get_state(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        state = super().get_state(*args, **kwargs)
        sub_envs = self._sub_envs()
        if sub_envs is not None:
            state[RNG_STATE] = {
                "torch": torch.get_rng_state().numpy(),
                "envs": [env.unwrapped.np_random.bit_generator.state for env in sub_envs],
                "seeded": self._seed is None,
                "worker_index": self.worker_index,
            }
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        rng = state.get(RNG_STATE)
        sub_envs = self._sub_envs()
        # Only the runner the state came from takes its random streams: two runners with
        # one stream would sample identical episodes.
        if (
            rng is None
            or rng["worker_index"] != self.worker_index
            or sub_envs is None
            or len(sub_envs) != len(rng["envs"])
        ):
            return
        torch.set_rng_state(torch.as_tensor(rng["torch"]))
        if rng["seeded"]:
            for env, env_state in zip(sub_envs, rng["envs"]):
                env.unwrapped.np_random.bit_generator.state = env_state
            self._seed = None
