"""The ``haepo sweep`` sub-command.

    haepo sweep SPEC [--address ADDR] [--tracking-uri URI] [--experiment NAME] [--resume]
                     [--dry-run] [--storage-path PATH] [--no-tracking] [--quiet]
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from haepo_ray.cli.args import add_experiment, add_spec, add_storage_path, add_tracking_uri
from haepo_ray.cli.errors import INTERRUPTED, TERMINATED, UsageError, configure_logging, exit_status
from haepo_ray.terminated import Terminated


def add_parser(subparsers) -> None:
    """Adds ``sweep`` to the ``haepo`` sub-command parsers."""
    p = subparsers.add_parser(
        "sweep",
        help="run a Ray Tune sweep from a YAML spec (tune_configs/), tracked in MLflow",
        description=(
            "Run the Ray Tune sweep that SPEC describes (see tune_configs/smoke.yaml for the "
            "format). Without --address it starts an embedded local Ray; MLflow logs one parent "
            "run per sweep and one nested child run per trial."
        ),
    )
    add_spec(p)
    p.add_argument("--address", metavar="ADDR",
                   help="join this Ray cluster (auto: the one on this machine, or HOST:6379) "
                        "instead of starting an embedded local Ray; from outside the cluster, "
                        "submit the sweep as a Ray job: haepo submit SPEC --address "
                        "http://HEAD:8265 (it runs haepo sweep SPEC --address auto on the head)")
    add_tracking_uri(p)
    add_experiment(p, folder=True)
    p.add_argument("--resume", action="store_true",
                   help="continue the newest run of this experiment (after a crash or kill): "
                        "finished trials stay finished, the others restart from their last "
                        "checkpoint, MLflow runs are reused")
    p.add_argument("--dry-run", action="store_true",
                   help="validate the spec and print the resolved trials; run nothing")
    add_storage_path(p)
    p.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
    p.add_argument("--quiet", action="store_true", help="no live trial table, only the summary")
    p.epilog = ("Ctrl-C (or SIGTERM: haepo stop, kill) stops the sweep: Ray Tune saves its state, the runs of "
                "the trials it stops end KILLED in MLflow, and the exit status is 130 (143 for SIGTERM); the "
                "same command with --resume continues it. Exit status 1: a trial failed; 2: a bad spec or option.")
    p.set_defaults(func=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    from haepo_ray.sweep.dry_run import dry_run
    from haepo_ray.sweep.kinds import load_plan
    from haepo_ray.sweep.runner import SweepError, run_sweep
    from haepo_ray.sweep.spec import SpecError
    from haepo_ray.upstream import PatchSettingError, UpstreamVersionError

    configure_logging()
    try:
        plan = load_plan(args.spec)
    except SpecError as err:
        raise UsageError(f"invalid spec\n{err}") from None
    if args.dry_run:
        try:
            dry_run(plan, experiment=args.experiment, storage_path=args.storage_path,
                    tracking_uri=args.tracking_uri, address=args.address)
        except (SpecError, UpstreamVersionError, PatchSettingError) as err:
            raise UsageError(str(err)) from None
        return 0
    from haepo_ray.sweep.paths import experiment_root, latest_run_dir

    root = experiment_root(plan.spec, args.experiment, args.storage_path)
    before = None if args.resume else latest_run_dir(root)  # an earlier sweep, which --resume would continue
    try:
        result = run_sweep(
            plan,
            address=args.address,
            tracking_uri=args.tracking_uri,
            experiment=args.experiment,
            resume=args.resume,
            storage_path=args.storage_path,
            track=not args.no_tracking,
            verbose=0 if args.quiet else 1,
            spec_text=Path(args.spec).read_text(),
        )
    except (SweepError, SpecError, UpstreamVersionError, PatchSettingError) as err:
        raise UsageError(str(err)) from None
    except KeyboardInterrupt as err:  # before Tune took Ctrl-C (SIGTERM) over, or a second one: no last save
        print(f"\nhaepo sweep: {after_interrupt(root, before, args.resume)}", file=sys.stderr)
        return TERMINATED if isinstance(err, Terminated) else INTERRUPTED
    if result.interrupted_by is not None:
        return exit_status(signal.Signals[result.interrupted_by])
    return 1 if any(t.status == "ERROR" for t in result.trials) else 0


def after_interrupt(root: str, before: str | None, resume: bool) -> str:
    """What to run after an interrupt that Ray Tune did not take over (before its fit, or a
    second one): ``--resume`` where this sweep's run under ``root`` holds an experiment state Tune
    saved, else the command again. ``before``: the run ``--resume`` took before this command
    started; an earlier sweep's, which ``--resume`` must not be advised to continue in this
    one's place."""
    from haepo_ray.sweep.paths import latest_run_dir
    from haepo_ray.upstream.tune_restore import newest_state_file

    latest = latest_run_dir(root)  # the run --resume takes now
    if latest is not None and (resume or latest != before) and newest_state_file(latest) is not None:
        return ("interrupted before Ray Tune saved the sweep's last state: the same command with --resume "
                f"continues it from the state Tune saved in {latest}")
    earlier = latest is not None and latest == before
    return ("interrupted before Ray Tune saved the sweep's state: run the same command again"
            + (f" (--resume would continue an earlier sweep, {latest})" if earlier else ""))
