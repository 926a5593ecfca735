"""``haepo train``: one trial in an embedded Ray, progress per iteration, a final checkpoint."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from haepo_ray import names
from haepo_ray.cli.errors import UsageError


def add_parser(subparsers) -> None:
    train = subparsers.add_parser("train", help="train one trial locally and write a checkpoint")
    train.add_argument("--env", required=True, help="a gymnasium id, e.g. CartPole-v1 or haepo/ChainMDP-v0")
    train.add_argument("--algo", default="HAEPO", help="HAEPO (default), DPO, GRPO or an RLlib algorithm name, e.g. PPO")
    stop = train.add_argument_group("stop criteria (any that is met stops; default --stop-iters 100)")
    stop.add_argument("--stop-iters", type=int, help="training iterations")
    stop.add_argument("--stop-time", type=float, help="wall-clock seconds")
    stop.add_argument("--stop-return", type=float, help="mean episode return")
    train.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    train.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="an algorithm setting, value in YAML, e.g. --set lr=0.01 (repeatable)")
    train.add_argument("--checkpoint-dir", help="where to write the final checkpoint")
    train.add_argument("--num-cpus", type=int, default=None, help="CPUs for the embedded Ray (default: all)")
    train.set_defaults(func=cmd_train)


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """``["lr=0.01", "model_config={fcnet_hiddens: [128]}"]`` -> dict; values are YAML."""
    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set expects key=value, got {pair!r}")
        try:
            overrides[key.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError as err:
            raise UsageError(f"--set {key}: value {raw!r} is not valid YAML ({err})") from None
    return overrides


def train_config(algo: str, env: str, seed: int | None, overrides: dict[str, Any]):
    """The validated AlgorithmConfig of ``haepo train`` (:func:`haepo_ray.configs.build_config`)."""
    from haepo_ray import configs
    from haepo_ray.envs import check_env_id
    from haepo_ray.registry import UnknownAlgorithm

    try:
        check_env_id(env)
        return configs.validate(configs.build_config(algo, env, seed=seed, settings=overrides))
    except (UnknownAlgorithm, ValueError) as err:
        raise UsageError(str(err)) from None


def _progress_line(result: dict[str, Any]) -> str:
    runners = result.get("env_runners", {})
    learner = result.get("learners", {}).get("default_policy", {})
    ret = runners.get("episode_return_mean", math.nan)
    parts = [
        f"iter {result[names.TRAINING_ITERATION]:5d}",
        f"steps {int(runners.get('num_env_steps_sampled_lifetime', 0)):>9,}",
        f"episodes {int(runners.get('num_episodes_lifetime', 0)):>7,}",
        f"return {ret:9.3f}",
    ]
    if "weight_entropy" in learner:
        parts += [f"H(w) {learner['weight_entropy']:6.3f}", f"KL {learner['kl_to_reference']:8.2e}"]
    parts.append(f"{result.get(names.TIME_THIS_ITER_S, 0.0):6.2f} s")
    return " | ".join(parts)


def cmd_train(args: argparse.Namespace) -> int:
    if args.stop_iters is None and args.stop_time is None and args.stop_return is None:
        args.stop_iters = 100
    config = train_config(args.algo, args.env, args.seed, parse_overrides(args.set or []))
    import ray

    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    algo = config.build_algo()
    start = time.monotonic()
    try:
        while True:
            result = algo.train()
            print(_progress_line(result), flush=True)
            ret = result.get("env_runners", {}).get("episode_return_mean", -math.inf)
            if (
                (args.stop_iters is not None and result[names.TRAINING_ITERATION] >= args.stop_iters)
                or (args.stop_time is not None and time.monotonic() - start >= args.stop_time)
                or (args.stop_return is not None and ret >= args.stop_return)
            ):
                break
        out = Path(args.checkpoint_dir or Path(".haepo") / "checkpoints" / f"{args.algo}-{args.env.replace('/', '_')}-{time.strftime('%Y%m%d-%H%M%S')}")
        algo.save_to_path(out.resolve())
        print(f"checkpoint: {out.resolve()}")
    finally:
        algo.stop()
        ray.shutdown()
    return 0
