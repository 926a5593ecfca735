"""Learner-connector piece that gives every timestep its episode's index and return.

RLlib's learner pipeline turns episodes into a flat batch of timesteps and forgets which
episode a row came from. HAEPO needs both per row: the episode index ``k`` (to sum the
step log-probabilities into L_k) and the episode's discounted return
R_k = sum_t gamma^(t-1) r_t (paper, appendix "Log-likelihood & Return").
"""

from __future__ import annotations

from typing import Any

import numpy as np
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule
from ray.rllib.utils.typing import EpisodeType

EPISODE_INDEX = "haepo_episode_index"
EPISODE_RETURN = "haepo_episode_return"


def discounted_return(rewards: np.ndarray, gamma: float) -> float:
    """R = sum_{t=1}^{T} gamma^(t-1) r_t, accumulated in float64."""
    rewards = np.asarray(rewards, dtype=np.float64)
    return float(np.dot(gamma ** np.arange(len(rewards), dtype=np.float64), rewards))


class AddEpisodeIndexAndReturn(ConnectorV2):
    """Writes ``EPISODE_INDEX`` and ``EPISODE_RETURN`` columns, one value per timestep.

    Episodes are numbered 0..M-1 in the order they reach the learner. Every episode must
    be complete (terminated or truncated) and its rewards finite; otherwise a
    ``ValueError`` names the episode.
    """

    def __init__(self, input_observation_space=None, input_action_space=None, *, gamma: float):
        super().__init__(input_observation_space, input_action_space)
        self.gamma = gamma

    def __call__(
        self,
        *,
        rl_module: MultiRLModule,
        episodes: list[EpisodeType],
        batch: dict[str, Any],
        **kwargs,
    ) -> dict[str, Any]:
        for k, episode in enumerate(
            self.single_agent_episode_iterator(episodes, agents_that_stepped_only=False)
        ):
            rewards = np.asarray(episode.get_rewards(), dtype=np.float64)
            if not np.isfinite(rewards).all():
                step = int(np.flatnonzero(~np.isfinite(rewards))[0])
                raise ValueError(
                    f"HAEPO: episode {episode.id_} has a non-finite reward "
                    f"({rewards[step]}) at step {step}; check the environment's reward"
                )
            if not episode.is_done:
                raise ValueError(
                    f"HAEPO: episode {episode.id_} is not complete (length {len(episode)}); "
                    "HAEPO trains on complete episodes only"
                )
            n = len(episode)
            self.add_n_batch_items(
                batch=batch, column=EPISODE_INDEX, items_to_add=np.full(n, k, dtype=np.int64),
                num_items=n, single_agent_episode=episode,
            )
            self.add_n_batch_items(
                batch=batch, column=EPISODE_RETURN,
                items_to_add=np.full(n, discounted_return(rewards, self.gamma), dtype=np.float32),
                num_items=n, single_agent_episode=episode,
            )
        return batch
