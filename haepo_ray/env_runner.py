"""HAEPOEnvRunner: RLlib's SingleAgentEnvRunner, sampling complete episodes without bias.

Length bias: with several envs per runner, RLlib's ``sample(num_episodes=n)`` returns the
first n episodes to finish; an env that finishes a short episode starts another, so short
episodes are over-represented. This runner samples in rounds: in a round each of k envs
contributes exactly its first episode, and the other envs are parked (they return their
last observation without stepping and are not counted as env steps), so the episodes of
a batch are i.i.d. draws of the policy, as HAEPO's listwise weights assume.

Seeding: RLlib 2.60 seeds env runner w with ``seed + w`` and its vector env gives sub-env i
``seed + w + i``: runner 2's env i replays runner 1's env i + 1 (duplicate episodes in one
batch), and trials with seeds s and s + 1 share most of their env streams. This runner gives
every sub-env its own seed, drawn from ``numpy.random.SeedSequence([seed, w, evaluation])``,
so envs, runners and trial seeds draw independent streams. RLlib 2.60's
``sample(num_episodes=n)`` also re-seeds every env at each call, so every batch would start
from the same initial states and draw the same env noise. This runner seeds its envs only at
the first reset; later resets continue each env's own random stream. Its state (and so an
Algorithm checkpoint) also holds the random state of its envs and of PyTorch's sampler,
so a restored algorithm with one env runner (``num_env_runners=0``) continues exactly as
the original would have; with remote runners, the runner whose state was saved takes it
back and the others keep their own seeded streams.

Speed: RLlib's sampling loop runs its env-to-module and module-to-env connector pipelines,
and times each piece, at every env step; on CartPole that is most of the sampling time. For
the common case (one agent, a stateless RLModule, RLlib's default connectors, a Box
observation space, callbacks without per-step hooks) this runner samples on a lean path
instead: one batched forward pass over its envs per step (observations converted as
RLlib's ``NumpyToTensor`` does: float64 to float32, other dtypes such as uint8 images kept,
on the module's device, CPU or GPU), actions drawn and scored as RLlib's ``GetActions`` and
``NormalizeAndClipActions`` do, and each finished episode built once as a
``SingleAgentEpisode``. Episodes are assigned to envs in the order they start (the
first n episodes to start are the batch): which episodes count never depends on their own
length, so the batch is unbiased, and an env that is done waits without stepping. Any other
configuration samples through RLlib's loop with the rounds described above.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.callbacks.utils import make_callback
from ray.rllib.core.columns import Columns
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO
from ray.rllib.utils.spaces.space_utils import clip_action, unsquash_action
from ray.rllib.utils.torch_utils import convert_to_torch_tensor

RNG_STATE = "haepo_rng_state"
logger = logging.getLogger(__name__)


class OneEpisodePerRound(gym.Wrapper):
    """Lets its env run one episode per round, then parks it until the next round."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.active = True  # may run an episode in this round
        self.started = False  # has started this round's episode
        self.parked = False
        self.parked_steps = 0
        self._obs = None

    def start_round(self, active: bool) -> None:
        self.active, self.started = active, False

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)  # also on parking: keeps seeding deterministic
        self._obs = obs
        self.parked = not self.active or self.started
        self.started = True
        return obs, info

    def step(self, action):
        if self.parked:
            self.parked_steps += 1
            return self._obs, 0.0, False, False, {}
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._obs = obs
        return obs, reward, terminated, truncated, info


class IndependentSeedsEnvRunner(SingleAgentEnvRunner):
    """RLlib's SingleAgentEnvRunner with an independent seed per sub-env (module docstring).

    Sweeps and ``haepo train`` give it to algorithms that use RLlib's default env runner
    (PPO), so that their seeds, too, are independent (:func:`haepo_ray.configs.apply_defaults`).
    """

    def __init__(self, *, config, **kwargs: Any):
        super().__init__(config=config, **kwargs)
        if self._seed is not None:
            entropy = [config.seed, self.worker_index or 0, int(config.in_evaluation)]
            self._seed = [int(s) for s in np.random.SeedSequence(entropy).generate_state(self.num_envs)]


class HAEPOEnvRunner(IndependentSeedsEnvRunner):
    """A SingleAgentEnvRunner that samples unbiased complete episodes and seeds its envs once."""

    def make_env(self) -> None:
        super().make_env()
        vector_env = self.env.unwrapped
        if self.num_envs > 1:
            if isinstance(vector_env, gym.vector.SyncVectorEnv):
                vector_env.envs = [OneEpisodePerRound(env) for env in vector_env.envs]
            else:
                logger.warning(
                    "HAEPOEnvRunner: %s is not a SyncVectorEnv; sampling episodes the "
                    "RLlib way, which favours short episodes", type(vector_env).__name__,
                )

    def sample(self, *args: Any, num_episodes: int | None = None, **kwargs: Any):
        rounds = self._round_wrappers()
        if num_episodes is None or not rounds or self._lean_path_blocker() is None:
            episodes = super().sample(*args, num_episodes=num_episodes, **kwargs)
        else:
            episodes = []
            while len(episodes) < num_episodes:
                k = min(len(rounds), num_episodes - len(episodes))
                for i, wrapper in enumerate(rounds):
                    wrapper.start_round(active=i < k)
                episodes += super().sample(*args, num_episodes=k, **kwargs)
        return episodes

    def _sample(self, *, num_episodes: int | None = None, explore: bool,
                random_actions: bool = False, **kwargs: Any):
        if num_episodes is None or random_actions or self._lean_path_blocker() is not None:
            episodes = super()._sample(num_episodes=num_episodes, explore=explore,
                                       random_actions=random_actions, **kwargs)
        else:
            episodes = self._sample_lean(num_episodes, explore)
        # Seeded by the first call (the first round); later resets continue the envs' streams.
        self._seed = None
        return episodes

    def _lean_path_blocker(self) -> str | None:
        """Why this runner must sample through RLlib's loop, or None if the lean path fits."""
        cfg = self.config
        if cfg.is_multi_agent or self.module is None or self.module.is_stateful():
            return "multi-agent or stateful module"
        if cfg._env_to_module_connector is not None or cfg._module_to_env_connector is not None:
            return "custom connectors"
        if not isinstance(self.env.single_observation_space, gym.spaces.Box):
            return "observation space is not a Box"
        if not isinstance(self.env.single_action_space, (gym.spaces.Box, gym.spaces.Discrete)):
            return "action space is neither Box nor Discrete"
        if self._sub_envs() is None:
            return "not a SyncVectorEnv"
        per_step = ("on_episode_created", "on_episode_start", "on_episode_step")
        if any(getattr(cfg, f"callbacks_{hook}") is not None for hook in per_step) or any(
            getattr(type(cb), hook) is not getattr(RLlibCallback, hook)
            for cb in self._callbacks for hook in per_step
        ):
            return "callbacks with per-step hooks"
        return None

    def _sample_lean(self, num_episodes: int, explore: bool) -> list[SingleAgentEpisode]:
        """``num_episodes`` complete episodes, the first that start, one forward pass per step."""
        envs = [env.env if isinstance(env, OneEpisodePerRound) else env for env in self._sub_envs()]
        seed = self._seed
        dist_cls = (self.module.get_exploration_action_dist_cls() if explore
                    else self.module.get_inference_action_dist_cls())
        space = self.env.single_action_space
        running: dict[int, _EpisodeRecord] = {}
        done: list[SingleAgentEpisode] = []
        started = steps = 0

        def start(i: int, env_seed: int | None = None) -> None:
            nonlocal started
            obs, info = envs[i].reset(seed=env_seed)
            running[i] = _EpisodeRecord(obs, info)
            started += 1

        # Seeded once, each env from its own seed; an env this call does not use is reset
        # once so that it, too, starts from its seed later.
        for i, env in enumerate(envs):
            env_seed = None if seed is None else seed[i]
            if i < num_episodes:
                start(i, env_seed)
            elif env_seed is not None:
                env.reset(seed=env_seed)
        while running:
            ids = list(running)
            # As RLlib's NumpyToTensor: float64 -> float32, other dtypes (uint8 images) kept,
            # on the module's device; the learner's batch goes through the same conversion.
            obs = convert_to_torch_tensor(np.stack([running[i].observations[-1] for i in ids]),
                                          device=self._device)
            with torch.no_grad():
                out = (self.module.forward_exploration({Columns.OBS: obs}, t=self.num_env_steps_sampled_lifetime + steps)
                       if explore else self.module.forward_inference({Columns.OBS: obs}))
                dist = dist_cls.from_logits(out[Columns.ACTION_DIST_INPUTS])
                if not explore:
                    dist = dist.to_deterministic()
                actions = dist.sample()
                logp = dist.logp(actions)
            actions, logp = actions.cpu().numpy(), logp.cpu().numpy()
            dist_inputs = out[Columns.ACTION_DIST_INPUTS].cpu().numpy()
            for row, i in enumerate(ids):
                action = actions[row]
                if self.config.normalize_actions:
                    to_env = unsquash_action(action, space)
                elif self.config.clip_actions:
                    to_env = clip_action(action, space)
                else:
                    to_env = action
                record = running[i]
                record.step(envs[i].step(to_env), action, logp[row], dist_inputs[row])
                steps += 1
                if record.terminated or record.truncated:
                    done.append(self._finish_episode(record, i))
                    del running[i]
                    if started < num_episodes:
                        start(i)
        self._done_episodes_for_metrics.extend(done)
        self._log_env_steps(metric=self._metrics_num_env_steps_sampled, num_steps=steps)
        self._increase_sampled_metrics(steps, len(done))
        return done

    def _finish_episode(self, record: _EpisodeRecord, env_index: int) -> SingleAgentEpisode:
        seq_no = self._weights_seq_no
        episode = SingleAgentEpisode(
            observations=record.observations, infos=record.infos, actions=record.actions,
            rewards=record.rewards, terminated=record.terminated, truncated=record.truncated,
            extra_model_outputs={
                Columns.ACTION_LOGP: record.logp,
                Columns.ACTION_DIST_INPUTS: record.dist_inputs,
                WEIGHTS_SEQ_NO: [seq_no] * len(record.actions),
            },
            observation_space=self.env.single_observation_space,
            action_space=self.env.single_action_space,
            len_lookback_buffer=0,
            t_started=0,
        )
        episode._start_time, episode._last_step_time = record.start_time, time.perf_counter()
        make_callback(
            "on_episode_end",
            callbacks_objects=self._callbacks,
            callbacks_functions=self.config.callbacks_on_episode_end,
            kwargs=dict(episode=episode, env_runner=self, metrics_logger=self.metrics,
                        env=self.env.unwrapped, rl_module=self.module, env_index=env_index,
                        prev_episode_chunks=[]),
        )
        return episode.to_numpy() if self.episodes_to_numpy else episode

    def _increase_sampled_metrics(self, num_steps: int, num_episodes_completed: int) -> int:
        parked = 0
        for wrapper in self._round_wrappers():
            parked, wrapper.parked_steps = parked + wrapper.parked_steps, 0
        return super()._increase_sampled_metrics(num_steps - parked, num_episodes_completed)

    def _round_wrappers(self) -> list[OneEpisodePerRound]:
        return [env for env in self._sub_envs() or [] if isinstance(env, OneEpisodePerRound)]

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


class _EpisodeRecord:
    """One running episode of the lean path, as plain lists."""

    def __init__(self, obs: Any, info: dict):
        self.observations, self.infos = [obs], [info]
        self.actions: list = []
        self.rewards: list[float] = []
        self.logp: list = []
        self.dist_inputs: list = []
        self.terminated = self.truncated = False
        self.start_time = time.perf_counter()

    def step(self, result: tuple, action: Any, logp: Any, dist_inputs: Any) -> None:
        obs, reward, self.terminated, self.truncated, info = result
        self.observations.append(obs)
        self.infos.append(info)
        self.actions.append(action)
        self.rewards.append(float(reward))
        self.logp.append(logp)
        self.dist_inputs.append(dist_inputs)
