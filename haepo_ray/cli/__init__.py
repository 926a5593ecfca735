"""The ``haepo`` command: one module per sub-command, the shared options in
:mod:`~haepo_ray.cli.args`, and :class:`UsageError` (printed without a traceback, exit 2); a
Ctrl-C exits 130 without a traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from haepo_ray import __version__
from haepo_ray.cli.errors import INTERRUPTED, TERMINATED, UsageError
from haepo_ray.terminated import Terminated

__all__ = ["UsageError", "main", "make_parser"]


def cmd_version(args: argparse.Namespace) -> int:
    import ray
    import torch

    print(f"haepo-ray {__version__} (ray {ray.__version__}, torch {torch.__version__})")
    return 0


def cmd_envs(args: argparse.Namespace) -> int:
    from haepo_ray.envs import registered_envs

    for env_id, description in registered_envs().items():
        print(f"{env_id:28s} {description}")
    return 0


def make_parser() -> argparse.ArgumentParser:
    from haepo_ray.cli import jobs, llm, report, sweep, train

    parser = argparse.ArgumentParser(
        prog="haepo", description="HAEPO on Ray: train, sweep and track experiments."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("version", help="print the versions of haepo-ray, Ray and PyTorch").set_defaults(func=cmd_version)
    sub.add_parser("envs", help="list the environments haepo-ray registers").set_defaults(func=cmd_envs)
    train.add_parser(sub)
    report.add_parser(sub)
    sweep.add_parser(sub)
    jobs.add_parsers(sub)
    llm.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        return args.func(args)
    except UsageError as err:
        print(f"haepo {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # Ctrl-C (or SIGTERM): what the command was writing ended as its handlers say
        terminated = isinstance(err, Terminated)
        print(f"\nhaepo {args.command}: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return TERMINATED if terminated else INTERRUPTED
