"""The ``haepo`` command."""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from haepo_ray import __version__


class UsageError(Exception):
    """A bad command line or setting: printed without a traceback, exit code 2."""


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


def build_config(algo: str, env: str, seed: int | None, overrides: dict[str, Any]):
    """An RLlib AlgorithmConfig for ``algo`` (a Tune name, e.g. ``HAEPO`` or ``PPO``) on ``env``."""
    from haepo_ray.envs import check_env_id
    from haepo_ray.registry import UnknownAlgorithm, algorithm_class
    from haepo_ray.settings import apply_defaults, apply_settings

    try:
        check_env_id(env)
    except ValueError as err:
        raise UsageError(str(err)) from None
    try:
        algo_cls = algorithm_class(algo)
    except UnknownAlgorithm as err:
        raise UsageError(str(err)) from None
    config = algo_cls.get_default_config().environment(env).debugging(seed=seed)
    apply_defaults(config)
    try:
        apply_settings(config, overrides)
        config.validate()
    except ValueError as err:
        raise UsageError(str(err).split("\nTo suppress")[0]) from None
    return config


def _progress_line(result: dict[str, Any]) -> str:
    runners = result.get("env_runners", {})
    learner = result.get("learners", {}).get("default_policy", {})
    ret = runners.get("episode_return_mean", math.nan)
    parts = [
        f"iter {result['training_iteration']:5d}",
        f"steps {int(runners.get('num_env_steps_sampled_lifetime', 0)):>9,}",
        f"episodes {int(runners.get('num_episodes_lifetime', 0)):>7,}",
        f"return {ret:9.3f}",
    ]
    if "weight_entropy" in learner:
        parts += [f"H(w) {learner['weight_entropy']:6.3f}", f"KL {learner['kl_to_reference']:8.2e}"]
    parts.append(f"{result.get('time_this_iter_s', 0.0):6.2f} s")
    return " | ".join(parts)


def cmd_train(args: argparse.Namespace) -> int:
    if args.stop_iters is None and args.stop_time is None and args.stop_return is None:
        args.stop_iters = 100
    config = build_config(args.algo, args.env, args.seed, parse_overrides(args.set or []))
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
                (args.stop_iters is not None and result["training_iteration"] >= args.stop_iters)
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


def cmd_envs(args: argparse.Namespace) -> int:
    from haepo_ray.envs import registered_envs

    for env_id, description in registered_envs().items():
        print(f"{env_id:28s} {description}")
    return 0


def cmd_version(args: argparse.Namespace) -> int:
    import ray
    import torch

    print(f"haepo-ray {__version__} (ray {ray.__version__}, torch {torch.__version__})")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from haepo_ray.report import build_report, to_text
    from haepo_ray.tracking import resolve_tracking_uri

    uri = resolve_tracking_uri(args.tracking_uri, create=False)
    try:
        report = build_report(uri, args.experiment, args.out)
    except LookupError as err:
        raise UsageError(str(err.args[0])) from None
    print(to_text(report.table))
    print(f"\n{len(report.figures)} figures, results.csv, results.md and index.html in {report.out.resolve()}")
    return 0


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="haepo", description="HAEPO on Ray: train, sweep and track experiments."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("version", help="print the versions of haepo-ray, Ray and PyTorch").set_defaults(func=cmd_version)
    sub.add_parser("envs", help="list the environments haepo-ray registers").set_defaults(func=cmd_envs)

    train = sub.add_parser("train", help="train one trial locally and write a checkpoint")
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

    report = sub.add_parser("report", help="turn sweeps in MLflow into figures, tables and an HTML page",
                            description="Read the trials of sweeps from MLflow, aggregate them over "
                                        "seeds and write figures (PNG, SVG), results.csv/.md and a "
                                        "self-contained index.html.")
    report.add_argument("--experiment", action="append", metavar="NAME",
                        help="an MLflow experiment (a sweep's name; repeatable; default: all)")
    report.add_argument("--out", default=str(Path(".haepo") / "report"), metavar="DIR",
                        help="output folder (default .haepo/report)")
    report.add_argument("--tracking-uri", metavar="URI",
                        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else "
                             "sqlite:///<cwd>/.haepo/mlflow.db)")
    report.set_defaults(func=cmd_report)

    from haepo_ray.jobs import add_parsers as add_job_parsers
    from haepo_ray.sweep.cli import add_parser as add_sweep_parser

    add_sweep_parser(sub)
    add_job_parsers(sub)
    from haepo_ray.llm.cli import add_parser as add_llm_parser
    add_llm_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        return args.func(args)
    except UsageError as err:
        print(f"haepo {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    # `python -m haepo_ray.cli`: run the imported module's main, so that the UsageError the
    # sub-commands import from haepo_ray.cli is the class main() catches (not __main__'s twin).
    from haepo_ray.cli import main as _main

    sys.exit(_main())
