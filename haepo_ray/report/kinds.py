"""The two kinds of trial a report reads, and what differs between them.

RL trials (RLlib, tag ``haepo.env``) step by training iteration and time themselves by Tune's
``time_total_s``; language-model trials (Ray Train, tag ``haepo.model``) step by RL update
(``update`` survives a restart, Tune's iteration does not) and time themselves by
``train_time_s`` (the trial's wall time: loading, SFT, RL updates, evaluation). Everything
else (loading, seeds -> mean +- std, the figures, the table) is one code path that reads its
metric names from a :class:`Kind`, so the two cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from haepo_ray import names

ENTROPY = "policy_entropy"  # RLlib's two entropy keys (names.POLICY_ENTROPY_KEYS) as one column
# How a trial's curve becomes one number: its last value, its peak, its mean over steps, its area
# (stats.auc: the trapezoid over its steps / their span) and the mean of its last TAIL_STEPS values.
LAST, MAX, MEAN, AUC, TAIL = "last", "max", "mean", "auc", "tail"
TAIL_STEPS = 10
HAEPO = "HAEPO"


@dataclass(frozen=True)
class Kind:
    """What a kind of trial logs and how the report shows it."""

    name: str
    step: str  # the MLflow step and the curves' index
    seconds: str  # the x axis "seconds": cumulative seconds at each step
    # (metric, label), preferred first: the first that every configuration of a sweep logged picks
    # its best configuration of a large grid and fills its heatmaps (aggregate.headline)
    headlines: tuple[tuple[str, str], ...]
    metrics: tuple[str, ...]  # the curves read from MLflow
    prefixes: tuple[str, ...] = ()  # metric families read whole ("peak_memory_mb/<phase>")
    curves: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # figure -> (metric, x, y label)
    table: tuple[tuple[str, str, str], ...] = ()  # (column, metric, LAST | MAX | MEAN over a trial)
    subject: tuple[str, ...] = ()  # tags naming what was trained, as table columns
    caption: str = ""  # what the table and curves show, above the kind's table
    intervals: tuple[tuple[str, str, str], ...] = ()  # (column, metric, how): mean and 95% CI over seeds
    haepo_only: tuple[str, ...] = ()  # metrics of HAEPO's weights: read from HAEPO trials alone


RL = Kind(
    name="rl",
    step=names.TRAINING_ITERATION,
    seconds=names.TIME_TOTAL_S,
    headlines=((names.EVAL_EPISODE_RETURN_MEAN, "evaluation return"), (names.EPISODE_RETURN_MEAN, "return")),
    metrics=(names.TIME_TOTAL_S, names.ENV_STEPS, names.EPISODE_RETURN_MEAN, names.EVAL_EPISODE_RETURN_MEAN,
             names.REGRET_PER_STEP, names.SUCCESS_RATE, *names.POLICY_ENTROPY_KEYS),
    curves={
        "return-vs-updates": (names.EPISODE_RETURN_MEAN, names.TRAINING_ITERATION, "mean return"),
        "return-vs-seconds": (names.EPISODE_RETURN_MEAN, names.TIME_TOTAL_S, "mean return"),
        "evaluation-return-vs-updates": (names.EVAL_EPISODE_RETURN_MEAN, names.TRAINING_ITERATION,
                                         "mean return of the evaluation runs"),
        "regret": (names.REGRET_PER_STEP, names.TRAINING_ITERATION, "per-step regret"),
        "success": (names.SUCCESS_RATE, names.TRAINING_ITERATION, "success rate"),
        "entropy": (ENTROPY, names.TRAINING_ITERATION, "policy entropy"),
    },
    table=((("return", names.EPISODE_RETURN_MEAN, LAST), ("evaluation return", names.EVAL_EPISODE_RETURN_MEAN, LAST),
            ("regret/step", names.REGRET_PER_STEP, LAST),
            ("success", names.SUCCESS_RATE, LAST), ("entropy", ENTROPY, LAST))),
    intervals=(("return final", names.EPISODE_RETURN_MEAN, LAST), ("return AUC", names.EPISODE_RETURN_MEAN, AUC),
               ("evaluation return final", names.EVAL_EPISODE_RETURN_MEAN, LAST),
               ("regret/step final", names.REGRET_PER_STEP, LAST), ("success final", names.SUCCESS_RATE, LAST)),
)

# The paper's language-model metrics (Sec. "LLM TL;DR"), all but time and memory from the held-out
# evaluation (eval/*, haepo_ray.llm.train), never from the training samples: summary quality and
# style of the greedy completions at the end of training, the reward of those sampled at the
# training temperature, the exact KL to the reference on the policy's own samples; peak memory (the highest
# phase of any update: the device a run needs) and the seconds an update takes; HAEPO's effective
# number of trajectories, of its training updates (what its weights did, not a result).
GREEDY_REWARD = names.llm_eval(names.LLM_REWARD)
GREEDY_ROUGE_L = names.llm_eval(names.LLM_ROUGE_L)
GREEDY_ROUGE_2 = names.llm_eval(names.LLM_ROUGE_2)
GREEDY_SEMANTIC_SIMILARITY = names.llm_eval(names.LLM_SEMANTIC_SIMILARITY)
EXACT_KL = names.llm_eval(names.LLM_EXACT_KL, names.LLM_EVAL_POLICY)
LLM = Kind(
    name="llm",
    step=names.LLM_UPDATE,
    seconds=names.LLM_TRAIN_TIME,
    headlines=((GREEDY_REWARD, "held-out reward"),),
    metrics=(names.LLM_TRAIN_TIME, names.LLM_UPDATE_TIME, names.LLM_EFFECTIVE_NUM_TRAJECTORIES,
             *names.llm_eval_keys(), *names.llm_eval_keys(names.LLM_EVAL_START)),
    prefixes=(f"{names.LLM_PEAK_MEMORY}/",),
    curves={
        "reward-vs-updates": (GREEDY_REWARD, names.LLM_UPDATE, "held-out reward (greedy)"),
        "reward-vs-seconds": (GREEDY_REWARD, names.LLM_TRAIN_TIME, "held-out reward (greedy)"),
        "rouge-l-vs-updates": (GREEDY_ROUGE_L, names.LLM_UPDATE, "held-out ROUGE-L (greedy)"),
        "rouge-l-vs-seconds": (GREEDY_ROUGE_L, names.LLM_TRAIN_TIME, "held-out ROUGE-L (greedy)"),
        "effective-trajectories-vs-updates": (names.LLM_EFFECTIVE_NUM_TRAJECTORIES, names.LLM_UPDATE,
                                              "HAEPO n_eff per group, 1 / sum w^2"),
    },
    table=(("reward", GREEDY_REWARD, LAST), ("reward sampled", names.llm_eval(names.LLM_REWARD, "sampled"), LAST),
           ("ROUGE-L", GREEDY_ROUGE_L, LAST), ("ROUGE-2", GREEDY_ROUGE_2, LAST),
           ("semantic similarity", GREEDY_SEMANTIC_SIMILARITY, LAST),
           ("profanity rate", names.llm_eval(names.LLM_PROFANITY_RATE), LAST),
           ("completion length", names.llm_eval(names.LLM_COMPLETION_LENGTH), LAST),
           ("KL exact", EXACT_KL, LAST),
           ("peak memory MB", names.LLM_PEAK_MEMORY, MAX), ("s / update", names.LLM_UPDATE_TIME, MEAN)),
    subject=("model", "data"),
    caption=("Language models: every column but peak memory and s / update is the last held-out "
             "evaluation (MLflow eval/*; eval_prompts prompts no SFT or RL example shares a text with), "
             "of greedy completions, or sampled at the training temperature where marked; KL exact: the "
             "per-token KL to the reference summed over the vocabulary and the completion, on samples of the "
             "policy itself (kl_samples per prompt, temperature 1, EOS allowed); never the training samples."),
    intervals=(("reward final", GREEDY_REWARD, LAST), ("reward AUC", GREEDY_REWARD, AUC),
               ("ROUGE-L final", GREEDY_ROUGE_L, LAST), ("ROUGE-L AUC", GREEDY_ROUGE_L, AUC),
               ("ROUGE-2 final", GREEDY_ROUGE_2, LAST),
               ("semantic similarity final", GREEDY_SEMANTIC_SIMILARITY, LAST),
               ("semantic similarity AUC", GREEDY_SEMANTIC_SIMILARITY, AUC),
               ("KL exact final", EXACT_KL, LAST),
               (f"n_eff last {TAIL_STEPS} updates", names.LLM_EFFECTIVE_NUM_TRAJECTORIES, TAIL)),
    haepo_only=(names.LLM_EFFECTIVE_NUM_TRAJECTORIES,),
)

STEPS = (RL.step, LLM.step)  # x axes of whole steps: the curves' grid is the steps themselves


def memory_phase(phase: str) -> str:
    """``generation`` -> ``peak_memory_mb/generation``: a phase's peak-memory metric."""
    return f"{names.LLM_PEAK_MEMORY}/{phase}"


def memory_phases(columns) -> list[str]:
    """The phases among ``columns`` (metric names), in an update's order, unknown ones last."""
    found = [c.split("/", 1)[1] for c in columns if c.startswith(f"{names.LLM_PEAK_MEMORY}/")]
    order = {p: i for i, p in enumerate(names.LLM_MEMORY_PHASES)}
    return sorted(found, key=lambda p: (order.get(p, len(order)), p))
