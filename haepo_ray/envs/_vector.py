"""What the numpy-vectorised versions of the paper's envs share."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space

from haepo_ray.envs._validation import check_int


class NumpyVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` copies of ``single`` (a built single env: its arguments are validated
    and its spaces are the sub-envs' spaces), stepped as one numpy batch.

    Autoreset is gymnasium's NEXT_STEP, as in its own vectorised CartPole: the ``step``
    after a sub-env's episode ends resets that sub-env (its action is ignored; it returns
    the start observation, reward 0, no flags, no info). ``_resetting`` marks those sub-envs.
    """

    metadata = {"render_modes": [], "autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}

    def __init__(self, single: gym.Env, num_envs: int):
        self.single = single
        self.num_envs = check_int(type(self).__name__, "num_envs", num_envs, 1)
        self.single_action_space = single.action_space
        self.single_observation_space = single.observation_space
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self._resetting = np.zeros(self.num_envs, bool)
