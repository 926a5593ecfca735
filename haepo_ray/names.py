"""Names of result metrics and MLflow tags, in one place (as RLlib's ``ray.rllib.utils.metrics``).

Result keys are Tune's "/"-flattened paths into an RLlib training result. Sweeps, tracking,
the report and the Prometheus exporter all read these names from here, so a renamed metric
or tag changes in one line.
"""

from __future__ import annotations

# The spec's (and ``haepo train --set``'s) name for a kind's batch size: RLlib's episodes or
# timesteps per batch (haepo_ray.rl.configs), a language-model update's prompts (batch_prompts).
BATCH_SIZE_ALIAS = "batch_size"

# --- Tune / RLlib result keys ("/"-flattened) ---------------------------------------------
TRAINING_ITERATION = "training_iteration"
TIME_TOTAL_S = "time_total_s"
TIME_THIS_ITER_S = "time_this_iter_s"
ENV_STEPS = "env_runners/num_env_steps_sampled_lifetime"
EPISODES = "env_runners/num_episodes_lifetime"
EPISODE_RETURN_MEAN = "env_runners/episode_return_mean"
EPISODE_RETURN_MIN = "env_runners/episode_return_min"
EPISODE_RETURN_MAX = "env_runners/episode_return_max"
EPISODE_LEN_MEAN = "env_runners/episode_len_mean"
# The paper's per-episode metrics (haepo_ray.rl.callbacks.EpisodeInfoMetrics).
REGRET_PER_STEP = "env_runners/regret_per_step_mean"
SUCCESS_RATE = "env_runners/success_rate"
# RLlib's evaluation runs (AlgorithmConfig.evaluation) report the env runners' keys under "evaluation/".
EVALUATION = "evaluation"
EVAL_EPISODE_RETURN_MEAN = f"{EVALUATION}/{EPISODE_RETURN_MEAN}"
# Learner metrics of the default module; HAEPO and the baselines log the policy entropy as
# policy_entropy, RLlib's PPO as entropy.
LEARNER = "learners/default_policy"
POLICY_ENTROPY = f"{LEARNER}/policy_entropy"
POLICY_ENTROPY_KEYS = (POLICY_ENTROPY, f"{LEARNER}/entropy")
# HAEPO's learner diagnostics (haepo_ray.rl.learner).
WEIGHT_ENTROPY = f"{LEARNER}/weight_entropy"
KL_TO_REFERENCE = f"{LEARNER}/kl_to_reference"
EFFECTIVE_NUM_TRAJECTORIES = f"{LEARNER}/effective_num_trajectories"
MAX_WEIGHT = f"{LEARNER}/max_weight"
# Language-model trials: the metric rows of haepo_ray.llm.train, one Tune result per RL update.
LLM_GENERATIONS = "generations.jsonl"  # an LM trial's artifact: its evaluations' prompts, completions, scores
LLM_UPDATE = "update"  # the RL update: the step of LM trials (survives a restart from checkpoint)
LLM_REWARD = "reward_mean"
LLM_ROUGE_L = "rouge_l"
LLM_ROUGE_2 = "rouge_2"
LLM_SEMANTIC_SIMILARITY = "semantic_similarity"
LLM_PROFANITY_RATE = "profanity_rate"
LLM_COMPLETION_LENGTH = "completion_length"
LLM_EFFECTIVE_NUM_TRAJECTORIES = "effective_num_trajectories"
LLM_KL = "kl"
LLM_LOSS = "loss"
LLM_UPDATE_TIME = "time_s"
LLM_FLOAT16_OVERFLOWS = "float16_overflows"  # float16 mixed precision: gradients computed again at half the scale
LLM_TRAIN_TIME = "train_time_s"  # the trial's wall time so far: loading, SFT, RL updates, evaluation
LLM_PHASE_TIME = "phase_time_s"  # "phase_time_s/<phase>": cumulative seconds, one per phase below
LLM_TIME_PHASES = ("load", "sft", "rollout", "update", "metrics", "eval")
LLM_PEAK_MEMORY = "peak_memory_mb"  # "peak_memory_mb/<phase>", one per phase below
LLM_PEAK_RESERVED_MEMORY = "peak_memory_reserved_mb"  # the same for the CUDA allocator's reserved memory
LLM_MEMORY_PHASES = ("generation", "reference", "forward_backward", "optimizer")  # an update's order
# The held-out evaluation (haepo_ray.llm.train): "eval/<mode>/<metric>" at the update it ran after,
# mode greedy (one completion per prompt) or sampled (eval_samples at the training temperature),
# and "eval/policy/<metric>" of kl_samples completions per prompt sampled from the policy itself
# (temperature 1, EOS allowed): the exact KL to the reference (haepo_ray.llm.evaluate) and their length.
LLM_EVAL = "eval"
LLM_EVAL_MODES = ("greedy", "sampled")
LLM_TOKEN_F1 = "token_f1"
LLM_LENGTH_CLOSENESS = "length_closeness"
LLM_EVAL_METRICS = (LLM_REWARD, LLM_TOKEN_F1, LLM_SEMANTIC_SIMILARITY, LLM_LENGTH_CLOSENESS, LLM_ROUGE_L,
                    LLM_ROUGE_2, LLM_COMPLETION_LENGTH, LLM_PROFANITY_RATE)
LLM_EXACT_KL = "kl_exact"
LLM_EVAL_POLICY = "policy"
LLM_EVAL_POLICY_METRICS = (LLM_EXACT_KL, LLM_COMPLETION_LENGTH)
# The SFT start's held-out evaluation (settings eval_start), before the first RL update: in that
# update's row as "eval_start/<mode>/<metric>", in generations.jsonl as update 0.
LLM_EVAL_START = "eval_start"
# Where Ray Train puts a trial's checkpoint in the Tune result (ray.tune.integration.ray_train).
CHECKPOINT_PATH = "checkpoint_path"
# Result keys carried over from an earlier iteration, which MLflow does not log again (a key names
# the keys below it too): a sweep trial's metric (haepo_ray.sweep.kinds.rl.trainable), RLlib's last
# evaluation (haepo_ray.rl.evaluation).
CARRIED_OVER = "haepo_carried_over"
# The trial process's provenance tags (haepo_ray.provenance), in every result of a sweep trial.
PROVENANCE = "haepo_provenance"
# Tags a trial sets on its own run, in its results (a language-model trial's SFT start).
RUN_TAGS = "haepo_run_tags"

# --- MLflow tags ----------------------------------------------------------------------------
PARENT_RUN = "mlflow.parentRunId"
ROLE = "haepo.role"  # "sweep" on a parent run, "trial" on a child run
SWEEP = "haepo.sweep"
SWEEP_DIR = "haepo.sweep_dir"
SPEC = "haepo.spec"
RAY_ADDRESS = "haepo.ray_address"
UNTESTED_UPSTREAM = "haepo.untested_upstream"  # on a parent run: patches that ran on an untested library version
ALGORITHM = "haepo.algorithm"
ENV = "haepo.env"
MODEL = "haepo.model"  # language-model trials: the model and the data set
DATA = "haepo.data"
TRIAL_ID = "haepo.trial_id"
TRIAL_NAME = "haepo.trial_name"
SEED = "haepo.seed"
SEARCH_VALUES = "haepo.search_values"  # JSON: spec search-space name -> this trial's value
NODE_IP = "haepo.node_ip"
HOSTNAME = "haepo.hostname"
NUM_FAILURES = "haepo.num_failures"
ERROR = "haepo.error"
REPLAYED_STEPS = "haepo.replayed_steps"
SFT_START = "haepo.sft_start"  # language-model trials: the key of the SFT start RL began from (haepo_ray.llm.sft_start)
CHECKPOINT = "haepo.checkpoint"
RESTORED_FROM = "haepo.restored_from"  # haepo train --restore: the checkpoint the run went on from
NUM_TRIALS = "haepo.num_trials"
BEST_TRIAL_ID = "haepo.best_trial_id"
BEST_RUN_ID = "haepo.best_run_id"
# Provenance (haepo_ray.provenance): on every run, the parent's of the driver, a child's of its trial.
CODE_VERSION = "haepo.code.version"  # the installed haepo-ray version
CODE_COMMIT = "haepo.code.commit"  # git commit of the checkout, where it is one
CODE_DIRTY = "haepo.code.dirty"  # "true": tracked files differ from that commit, or the package has untracked ones
CODE_CHANGED = "haepo.code.changed"  # where dirty: which (provenance.changed_files)
CODE_PATCHES = "haepo.code.patches"  # the process's HAEPO_PATCHES setting ("all" when unset)
MACHINE_CPUS = "haepo.machine.cpus"
MACHINE_CPU = "haepo.machine.cpu"  # the CPU model
MACHINE_MEMORY_GB = "haepo.machine.memory_gb"
MACHINE_GPUS = "haepo.machine.gpus"  # "0" or "1 x NVIDIA H100 80GB HBM3": those the process sees
VERSION_RAY = "haepo.version.ray"
VERSION_RLLIB = "haepo.version.rllib"
VERSION_TORCH = "haepo.version.torch"
VERSION_MLFLOW = "haepo.version.mlflow"
VERSION_PYTHON = "haepo.version.python"
# The devices a trial's parts used (haepo_ray.provenance.device_tags): torch's devices, comma-separated
# where several processes differ ("cpu", "cuda:0"), and what Ray gave the trial's process.
DEVICE_LEARNER = "haepo.device.learner"  # an RL trial's learners
DEVICE_ENV_RUNNER = "haepo.device.env_runner"  # an RL trial's env runners' modules
DEVICE_POLICY = "haepo.device.policy"  # a language-model trial's policy
DEVICE_RAY_GPU_IDS = "haepo.device.ray_gpu_ids"  # ray.get_gpu_ids() of the trial's process ("" for none)
DEVICE_CUDA_VISIBLE = "haepo.device.cuda_visible_devices"  # its CUDA_VISIBLE_DEVICES ("unset" where not set)
PROVENANCE_PREFIXES = ("haepo.code.", "haepo.machine.", "haepo.version.", "haepo.device.")


def llm_eval(metric: str, mode: str = "greedy", at: str = LLM_EVAL) -> str:
    """``reward_mean`` -> ``eval/greedy/reward_mean``: a held-out metric's key (``at``
    :data:`LLM_EVAL_START`: the SFT start's, ``eval_start/greedy/reward_mean``)."""
    return f"{at}/{mode}/{metric}"


def llm_eval_keys(at: str = LLM_EVAL) -> tuple[str, ...]:
    """The key of every metric of a held-out evaluation (:func:`llm_eval`): each mode's, then the
    policy's own samples' (``at`` :data:`LLM_EVAL_START`: the SFT start's)."""
    return (*(llm_eval(m, mode, at) for mode in LLM_EVAL_MODES for m in LLM_EVAL_METRICS),
            *(llm_eval(m, LLM_EVAL_POLICY, at) for m in LLM_EVAL_POLICY_METRICS))
