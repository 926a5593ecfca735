"""HAEPOConfig and HAEPO: the RLlib algorithm (new API stack).

Use it like RLlib's PPO::

    from haepo_ray import HAEPOConfig

    config = (
        HAEPOConfig()
        .environment("CartPole-v1")
        .training(episodes_per_batch=8, lr=1e-2, beta_ent=0.1, beta_kl=0.1, grad_clip=0.5)
    )
    algo = config.build_algo()
    result = algo.train()

or by name with Ray Tune: ``tune.Tuner("HAEPO", param_space=config)`` after
:func:`haepo_ray.register_algorithms`.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided
from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE
from ray.rllib.core.learner.learner_group import LearnerGroup
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    ENV_RUNNER_SAMPLING_TIMER,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TIMERS,
    WEIGHTS_SEQ_NO,
)

from haepo_ray.rl.callbacks import EpisodeInfoMetrics
from haepo_ray.rl.env_runner import HAEPOEnvRunner
from haepo_ray.rl.observations import flatten_non_box
from haepo_ray.envs import register_with_ray
from haepo_ray.rl.learner import TRAINING_ITERATION
from haepo_ray.baseline_losses import lone_episode_reason
from haepo_ray.loss import ESTIMATORS, NORMALIZATIONS
from haepo_ray.rl.metrics import MetricsExporter
from haepo_ray.rl.schedules import ScheduleSpec, parse_schedule
from haepo_ray.upstream import rllib as rllib_internals

REFERENCE_POLICIES = ("lagged", "initial", "behavior")


class HAEPOConfig(AlgorithmConfig):
    """Configuration of the HAEPO algorithm; set HAEPO's knobs with :meth:`training`."""

    def __init__(self, algo_class: type | None = None):
        super().__init__(algo_class=algo_class or HAEPO)
        # HAEPO trains on complete episodes, all of them in every gradient step.
        self.batch_mode = "complete_episodes"
        self.minibatch_size = None
        self.episodes_per_batch = 8
        self.beta_ent: ScheduleSpec = 0.05
        self.beta_kl: ScheduleSpec = 0.05
        self.reward_normalization = "zscore"
        self.estimator = "weights"
        self.reference_policy = "lagged"
        self.reference_update_interval = 10
        self.lr = 1e-3
        self.num_epochs = 1
        self.log_gradients = True
        self.env_runner_cls = HAEPOEnvRunner
        self.callbacks_class = EpisodeInfoMetrics
        self.env_runners(env_to_module_connector=flatten_non_box)

    def training(
        self,
        *,
        episodes_per_batch: int | None = NotProvided,
        beta_ent: ScheduleSpec | None = NotProvided,
        beta_kl: ScheduleSpec | None = NotProvided,
        reward_normalization: str | None = NotProvided,
        estimator: str | None = NotProvided,
        reference_policy: str | None = NotProvided,
        reference_update_interval: int | None = NotProvided,
        **kwargs: Any,
    ) -> HAEPOConfig:
        """Sets HAEPO's training settings, and any of ``AlgorithmConfig.training``'s.

        Args:
            episodes_per_batch: M, the number of complete episodes per update.
            beta_ent: weight of the entropy bonus, a number or a schedule over env steps
                (see :mod:`haepo_ray.rl.schedules`).
            beta_kl: weight of the KL penalty towards the reference policy, same forms.
            reward_normalization: ``"zscore"``, ``"sum"`` or ``"none"``.
            estimator: the loss's gradient, ``"weights"`` (default: through the weights alone)
                or ``"unbiased"`` (the paper appendix's estimator, which adds the loss times
                grad log p of the sampled episodes); see :func:`haepo_ray.loss.haepo_loss`.
            reference_policy: ``"lagged"`` (default), ``"initial"`` or ``"behavior"``;
                see :class:`haepo_ray.rl.learner.HAEPOTorchLearner`.
            reference_update_interval: training iterations (``train()`` calls, however
                many updates and ``num_epochs`` gradient steps each runs) between refreshes
                of the ``"lagged"`` reference.
            kwargs: ``gamma``, ``lr``, ``grad_clip``, ``num_epochs`` (gradient steps per
                batch) and the rest of ``AlgorithmConfig.training``.
        """
        super().training(**kwargs)
        for name, value in (
            ("episodes_per_batch", episodes_per_batch),
            ("beta_ent", beta_ent),
            ("beta_kl", beta_kl),
            ("reward_normalization", reward_normalization),
            ("estimator", estimator),
            ("reference_policy", reference_policy),
            ("reference_update_interval", reference_update_interval),
        ):
            if value is not NotProvided:
                setattr(self, name, value)
        return self

    def validate(self) -> None:
        super().validate()
        if self.is_multi_agent:
            rllib_internals.config_error(self, (
                f"{self.algo_class.__name__}: multi-agent configs are not supported (policies "
                f"{sorted(map(str, self.policies))}): it ranks the complete episodes of one agent, the paper's "
                "single-agent setting (its Limitations); use a single-agent env and no .multi_agent(policies=...)"))
        m = self.episodes_per_batch
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            rllib_internals.config_error(self, f"HAEPO: episodes_per_batch must be an integer >= 1, got {m!r}")
        for name in ("beta_ent", "beta_kl"):
            try:
                parse_schedule(name, getattr(self, name))
            except ValueError as err:
                rllib_internals.config_error(self, f"HAEPO: {err}")
        if self.reward_normalization not in NORMALIZATIONS:
            rllib_internals.config_error(self, 
                f"HAEPO: reward_normalization must be one of {NORMALIZATIONS}, "
                f"got {self.reward_normalization!r}"
            )
        if self.estimator not in ESTIMATORS:
            rllib_internals.config_error(self, f"HAEPO: estimator must be one of {ESTIMATORS}, got {self.estimator!r}")
        if self.estimator != "weights" and self.algo_class is not HAEPO:  # the baselines' losses have their own
            rllib_internals.config_error(self, f"estimator {self.estimator!r} is HAEPO's gradient estimator, not "
                                               f"{self.algo_class.__name__}'s")
        lone = lone_episode_reason(self.algo_class.__name__, normalization=self.reward_normalization,
                                   estimator=self.estimator) if self.episodes_per_batch == 1 else None
        if lone:
            rllib_internals.config_error(self, f"{self.algo_class.__name__}: episodes_per_batch 1: {lone}, so no "
                                               "update learns from the return: use episodes_per_batch >= 2")
        if self.reference_policy not in REFERENCE_POLICIES:
            rllib_internals.config_error(self, 
                f"HAEPO: reference_policy must be one of {REFERENCE_POLICIES}, "
                f"got {self.reference_policy!r}"
            )
        n = self.reference_update_interval
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            rllib_internals.config_error(self, f"HAEPO: reference_update_interval must be an integer >= 1, got {n!r}")
        if self.minibatch_size is not None:
            rllib_internals.config_error(self, 
                "HAEPO: minibatch_size must be None; every gradient step uses all "
                f"episodes of the batch (got {self.minibatch_size!r})"
            )
        if self.batch_mode != "complete_episodes":
            rllib_internals.config_error(self, f"HAEPO: batch_mode must be 'complete_episodes', got {self.batch_mode!r}")
        if self.num_learners > self.episodes_per_batch:
            rllib_internals.config_error(self, 
                f"HAEPO: num_learners ({self.num_learners}) must be <= episodes_per_batch "
                f"({self.episodes_per_batch}): every learner needs at least one whole episode"
            )
        recurrent = [key for key in ("use_lstm", "use_attention") if self.model_config.get(key)]
        if recurrent:
            rllib_internals.config_error(self, 
                f"HAEPO: model_config {recurrent[0]}=True makes a stateful (recurrent) RLModule, "
                "which HAEPO does not support (its loss sums log-probabilities over flat "
                "timesteps, not zero-padded sequences); use a stateless model"
            )

    def get_default_rl_module_spec(self) -> RLModuleSpec:
        from ray.rllib.algorithms.bc.torch.default_bc_torch_rl_module import DefaultBCTorchRLModule

        return RLModuleSpec(module_class=DefaultBCTorchRLModule)

    def get_default_learner_class(self) -> type:
        from haepo_ray.rl.learner import HAEPOTorchLearner

        return HAEPOTorchLearner


def split_evenly(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` integers that differ by at most one."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def update_on_episodes(
    learner_group: LearnerGroup, episodes: list, *, timesteps: dict[str, Any], num_epochs: int
) -> list[dict]:
    """One update of ``learner_group`` on ``episodes``, every learner getting whole episodes.

    RLlib's own sharding may cut an episode in two or leave a learner without data (which
    would stall the others in the listwise gather): with several learners each one gets a
    non-empty list of whole episodes, and fewer episodes than learners is an error.
    """
    num_learners = len(learner_group)
    if num_learners <= 1:
        return learner_group.update(episodes=episodes, timesteps=timesteps, num_epochs=num_epochs)
    if len(episodes) < num_learners:
        raise ValueError(
            f"HAEPO: a batch of {len(episodes)} episodes cannot be shared by {num_learners} "
            "learners: every learner needs at least one whole episode (set episodes_per_batch "
            ">= num_learners)"
        )
    shards = shard_whole_episodes(episodes, num_learners)
    return learner_group.update(
        episodes_refs=[ray.put(shard) for shard in shards], timesteps=timesteps, num_epochs=num_epochs
    )


def shard_whole_episodes(episodes: list, num_shards: int) -> list[list]:
    """Whole episodes into ``num_shards`` lists of balanced total length (longest first)."""
    shards: list[list] = [[] for _ in range(num_shards)]
    lengths = [0] * num_shards
    for episode in sorted(episodes, key=len, reverse=True):
        i = min(range(num_shards), key=lambda s: (len(shards[s]) > 0, lengths[s]))
        shards[i].append(episode)
        lengths[i] += len(episode)
    return shards


class HAEPO(Algorithm):
    """HAEPO: sample M complete episodes, one (or ``num_epochs``) HAEPO update, sync weights."""

    @classmethod
    def get_default_config(cls) -> HAEPOConfig:
        return HAEPOConfig()

    def setup(self, config: AlgorithmConfig) -> None:
        register_with_ray()
        super().setup(config)
        self._metrics_exporter = MetricsExporter()

    def step(self) -> dict:
        result = super().step()
        env = self.config.env if isinstance(self.config.env, str) else type(self.config.env).__name__
        self._metrics_exporter.export(
            result, {"algorithm": type(self).__name__, "trial_id": self.trial_id, "env": env}
        )
        return result

    def training_step(self) -> None:
        with self.metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER)):
            episodes, env_runner_metrics = self.sample_episodes(self.config.episodes_per_batch)
        self.metrics.aggregate(env_runner_metrics, key=ENV_RUNNER_RESULTS)

        timesteps = {
            NUM_ENV_STEPS_SAMPLED_LIFETIME: self.metrics.peek(
                (ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0
            ),
            TRAINING_ITERATION: self.iteration,  # completed train() calls
        }
        with self.metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)):
            learner_results = update_on_episodes(
                self.learner_group, episodes, timesteps=timesteps, num_epochs=self.config.num_epochs
            )
        self.metrics.aggregate(learner_results, key=LEARNER_RESULTS)

        with self.metrics.log_time((TIMERS, SYNCH_WORKER_WEIGHTS_TIMER)):
            self._sync_weights()

    def _sync_weights(self) -> None:
        """The learners' weights to the env runners: ``EnvRunnerGroup.sync_weights``, without
        its ``ray.put`` of the weights when the only env runner is the local one (three
        quarters of its time on the bandit, for no remote reader)."""
        group = self.env_runner_group
        if group.num_remote_env_runners() > 0:
            group.sync_weights(from_worker_or_learner_group=self.learner_group, inference_only=True)
            return
        state = self.learner_group.get_state(
            components=f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}", inference_only=True
        )[COMPONENT_LEARNER]
        group.local_env_runner.set_state(
            {COMPONENT_RL_MODULE: state[COMPONENT_RL_MODULE], WEIGHTS_SEQ_NO: state[WEIGHTS_SEQ_NO]}
        )

    def sample_episodes(self, num_episodes: int) -> tuple[list, list[dict]]:
        """Exactly ``num_episodes`` complete episodes, spread over the healthy env runners."""
        group = self.env_runner_group
        episodes: list = []
        metrics: list[dict] = []
        while len(episodes) < num_episodes:
            need = num_episodes - len(episodes)
            if group.num_remote_env_runners() == 0:
                runner = group.local_env_runner
                episodes.extend(runner.sample(num_episodes=need))
                metrics.append(runner.get_metrics())
                continue
            runner_ids = group.healthy_env_runner_ids()
            if not runner_ids:
                raise RuntimeError(
                    f"HAEPO: no healthy env runner left to sample from ({need} of "
                    f"{num_episodes} episodes missing); see the env runners' errors above"
                )
            counts = split_evenly(need, len(runner_ids))
            ids = [rid for rid, n in zip(runner_ids, counts) if n > 0]
            results = group.foreach_env_runner(
                [_sample_fn(n) for n in counts if n > 0],
                local_env_runner=False,
                remote_worker_ids=ids,
            )
            for sampled, runner_metrics in results:
                episodes.extend(sampled)
                metrics.append(runner_metrics)
        return episodes, metrics


def _sample_fn(n: int):
    return lambda runner: (runner.sample(num_episodes=n), runner.get_metrics())

