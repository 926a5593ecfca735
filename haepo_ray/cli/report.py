"""``haepo report``: sweeps in MLflow -> figures, tables and an HTML page."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from haepo_ray.cli.args import add_experiment, add_tracking_uri, check_out_folder
from haepo_ray.cli.errors import UsageError


def add_parser(subparsers) -> None:
    report = subparsers.add_parser(
        "report", help="turn sweeps in MLflow into figures, tables and an HTML page",
        description="Read the trials of sweeps from MLflow, aggregate them over seeds and write "
                    "figures (PNG, SVG), results.csv/.md and index.html, its charts interactive and offline "
                    "(plotly.min.js beside it: the folder is the page); for RL, each configuration's results "
                    "with 95% confidence intervals over seeds (rl_results.csv); for language "
                    "models each method's held-out results with 95% confidence intervals over seeds and prompts "
                    "and its win rates against the others (llm_results.csv, win_rates.csv).")
    add_experiment(report, "an MLflow experiment (a sweep's name; repeatable; default: all)", repeat=True)
    report.add_argument("--out", default=str(Path(".haepo") / "report"), metavar="DIR",
                        help="output folder (default .haepo/report)")
    report.add_argument("--include-unfinished", action="store_true",
                        help="aggregate failed, killed and still running trials too (default: "
                             "only finished ones; the others are listed apart)")
    report.add_argument("--require-commit", metavar="SHA",
                        help="refuse (exit 2) when a run was not made by this git commit (runs "
                             "record theirs); bench/reproduce.sh passes its checkout's")
    add_tracking_uri(report)
    report.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from haepo_ray.report import ProvenanceError, build_report, report_text
    from haepo_ray.tracking import resolve_tracking_uri

    check_out_folder(args.out)
    try:
        uri = resolve_tracking_uri(args.tracking_uri, create=False)
    except ValueError as err:
        raise UsageError(str(err)) from None
    try:
        report = build_report(uri, args.experiment, args.out, include_unfinished=args.include_unfinished,
                              require_commit=args.require_commit)
    except (LookupError, ProvenanceError) as err:
        raise UsageError(str(err.args[0])) from None
    print(report_text(report))
    for warning in report.warnings:  # again where a script's reader looks for trouble
        print(f"WARNING: {warning}", file=sys.stderr)
    files = ["results.csv", *(name for name, part in report.listed_files.items() if len(part)), "results.md"]
    print(f"\n{len(report.figures)} figures, {', '.join(files)} and index.html (with plotly.min.js) in "
          f"{report.out.resolve()}")
    return 0
