"""``haepo submit``, ``jobs``, ``logs`` and ``stop``: the command lines of :mod:`haepo_ray.jobs`."""

from __future__ import annotations

import argparse
import functools
import shutil
import sys
import time
from collections.abc import Callable

from haepo_ray.cli.args import add_experiment, add_spec, add_storage_path, add_tracking_uri
from haepo_ray.cli.errors import INTERRUPTED, UsageError
from haepo_ray.jobs import (
    STOP_WAIT_S,
    TERMINAL,
    JobError,
    JobsClient,
    SubmitOptions,
    build_submission,
    job_status,
    tail_logs,
    wait_terminal,
)
from haepo_ray.tables import format_table

Command = Callable[[argparse.Namespace], int]


def _usage_errors(command: Command) -> Command:
    """``command`` with a :class:`~haepo_ray.jobs.JobError` raised as a UsageError."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except JobError as err:
            raise UsageError(str(err)) from None

    return run


def _add_connection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", metavar="URL",
                   help="the head's Jobs API (Ray dashboard), e.g. http://10.0.0.5:8265 (default: "
                        "$RAY_API_SERVER_ADDRESS, else an http(s) $RAY_ADDRESS)")
    p.add_argument("--auth-token-file", metavar="PATH",
                   help="the cluster's Ray auth token (default: $RAY_AUTH_TOKEN, else the file "
                        "$RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token when it exists)")


def add_parsers(subparsers) -> None:
    """Adds ``submit``, ``jobs``, ``logs`` and ``stop`` to the ``haepo`` sub-commands."""
    submit = subparsers.add_parser(
        "submit", help="run a sweep spec on a Ray cluster as a Ray Job",
        description=(
            "Submit the sweep SPEC to a running Ray cluster as a Ray Job (Jobs SDK) and print "
            "the job id. The job runs `haepo sweep SPEC --address auto` on the head node; "
            "--follow streams its logs and exits with its outcome (0 succeeded, 1 failed or "
            "stopped). See cluster/README.md."),
    )
    add_spec(submit)
    _add_connection(submit)
    submit.add_argument("--follow", action="store_true",
                        help="stream the job's logs until it ends; exit 0 if it succeeded, else 1")
    add_tracking_uri(submit, "MLflow tracking URI as the head node sees it (default: "
                             "$MLFLOW_TRACKING_URI here, else the cluster's own)")
    add_storage_path(submit, "Ray results and checkpoints, a path every node reaches (NFS, "
                             "s3://...) (default: the spec's storage_path, else "
                             "$HAEPO_STORAGE_PATH here, else $HAEPO_STORAGE_PATH on the head)")
    add_experiment(submit, "as for haepo sweep", folder=True)
    submit.add_argument("--resume", action="store_true",
                        help="continue the newest run of this experiment in the storage path")
    submit.add_argument("--working-dir", metavar="DIR",
                        help="ship DIR as the job's working directory (SPEC must be inside it); "
                             "default: a folder holding only SPEC")
    submit.add_argument("--py-modules", action="store_true",
                        help="ship this haepo_ray package's source with the job, for clusters "
                             "whose image lacks haepo-ray (its dependencies must be there, or "
                             "named with --pip)")
    submit.add_argument("--pip", action="append", metavar="REQUIREMENT",
                        help="a pip requirement installed for the job on every node (repeatable)")
    submit.add_argument("--env", action="append", metavar="KEY[=VALUE]",
                        help="an environment variable of the job (KEY alone: its value here); "
                             "visible in the job's details: no secrets (repeatable)")
    submit.add_argument("--job-id", metavar="ID",
                        help="the submission id (default: haepo-<experiment>-<time>-<random>)")
    submit.add_argument("--no-check", action="store_true",
                        help="check only the spec's structure here, not its algorithm, env and "
                             "setting names (which need RLlib)")
    submit.set_defaults(func=cmd_submit)

    jobs = subparsers.add_parser("jobs", help="list the jobs of a Ray cluster",
                                 description="List the submitted jobs of a Ray cluster, oldest first.")
    _add_connection(jobs)
    jobs.add_argument("--all", action="store_true",
                      help="also drivers that were not submitted as jobs (ray.init connections)")
    jobs.set_defaults(func=cmd_jobs)

    logs = subparsers.add_parser("logs", help="print (or follow) the logs of a job")
    logs.add_argument("job", metavar="JOB", help="a job id, as haepo submit printed it")
    _add_connection(logs)
    logs.add_argument("--follow", action="store_true",
                      help="stream until the job ends; exit 0 if it succeeded, else 1")
    logs.set_defaults(func=cmd_logs)

    stop = subparsers.add_parser("stop", help="stop a running job",
                                 description="Stop JOB: SIGTERM to its driver, the sweep, which stops "
                                             "as on Ctrl-C (Tune saves its state, the running trials' "
                                             "MLflow runs and the parent end KILLED; haepo submit "
                                             "--resume continues it); SIGKILL if it has not ended "
                                             f"{STOP_WAIT_S} s later.")
    stop.add_argument("job", metavar="JOB", help="a job id, as haepo submit printed it")
    _add_connection(stop)
    stop.add_argument("--no-wait", action="store_true", help="do not wait until the job has ended")
    stop.add_argument("--timeout", type=float, default=60.0, metavar="S",
                      help="how long to wait for the job to end (default 60 s)")
    stop.set_defaults(func=cmd_stop)



def submit_options(args: argparse.Namespace) -> SubmitOptions:
    """``haepo submit``'s parsed options as :class:`~haepo_ray.jobs.SubmitOptions`."""
    return SubmitOptions(
        spec=args.spec, tracking_uri=args.tracking_uri, storage_path=args.storage_path,
        experiment=args.experiment, resume=args.resume, working_dir=args.working_dir,
        py_modules=args.py_modules, pip=tuple(args.pip or ()), env=tuple(args.env or ()),
        job_id=args.job_id, check=not args.no_check)


@_usage_errors
def cmd_submit(args: argparse.Namespace) -> int:
    sub = build_submission(submit_options(args))
    try:
        client = JobsClient(args.address, args.auth_token_file)
        job_id = client.submit_job(entrypoint=sub.entrypoint, runtime_env=sub.runtime_env,
                                   metadata=sub.metadata, submission_id=sub.submission_id)
    finally:
        if sub.temporary:
            shutil.rmtree(sub.working_dir, ignore_errors=True)
    print(job_id, flush=True)
    err = sys.stderr
    print(f"submitted to {client.address}: {sub.entrypoint}", file=err)
    print(f"results: {sub.metadata['haepo.storage']}", file=err)
    for note in sub.notes:
        print(f"note: {note}", file=err)
    if not args.follow:
        print(f"logs: haepo logs {job_id} --address {client.address} --follow\n"
              f"stop: haepo stop {job_id} --address {client.address}", file=err, flush=True)
        return 0
    return follow(client, job_id)


@_usage_errors
def cmd_logs(args: argparse.Namespace) -> int:
    client = JobsClient(args.address, args.auth_token_file)
    job_status(client, args.job)
    if args.follow:
        return follow(client, args.job)
    sys.stdout.write(client.get_job_logs(args.job))
    return 0


def follow(client: JobsClient, job_id: str) -> int:
    """Prints the job's logs until it ends (polling where the stream breaks) and its outcome;
    0 if it succeeded, 130 when interrupted (the job goes on), else 1."""

    def write(chunk: str) -> None:
        sys.stdout.write(chunk)
        sys.stdout.flush()

    try:
        try:
            tail_logs(client, job_id, write)
        except KeyboardInterrupt:
            raise
        except Exception as err:  # the stream broke (head restarted, network): poll instead
            print(f"\nhaepo: log stream interrupted ({type(err).__name__}: {err}); waiting for "
                  f"the job to end", file=sys.stderr, flush=True)
        status = wait_terminal(client, job_id, timeout=None)
    except KeyboardInterrupt:
        print(f"\nhaepo: stopped following; the job goes on. Stop it with: haepo stop {job_id} "
              f"--address {client.address}", file=sys.stderr)
        return INTERRUPTED
    info = client.get_job_info(job_id)
    message = f": {info.message}" if info.message else ""
    print(f"haepo: job {job_id} {status}{message}", file=sys.stderr, flush=True)
    return 0 if status == "SUCCEEDED" else 1


def _fmt_time(ms: int | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms else "-"


def _fmt_duration(start: int | None, end: int | None) -> str:
    if not start:
        return "-"
    seconds = int(((end or time.time() * 1000) - start) / 1000)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


@_usage_errors
def cmd_jobs(args: argparse.Namespace) -> int:
    client = JobsClient(args.address, args.auth_token_file)
    jobs = client.list_jobs()
    if not args.all:
        jobs = [j for j in jobs if j.submission_id]
    jobs.sort(key=lambda j: j.start_time or 0)
    if not jobs:
        print(f"no jobs on {client.address}")
        return 0
    rows = []
    for j in jobs:
        meta = j.metadata or {}
        entry = j.entrypoint or ""
        rows.append([j.submission_id or j.job_id or "-", str(getattr(j.status, "value", j.status)),
                     _fmt_time(j.start_time), _fmt_duration(j.start_time, j.end_time),
                     meta.get("haepo.experiment", "-"),
                     entry if len(entry) <= 60 else entry[:57] + "..."])
    print(format_table(["job", "status", "started", "duration", "experiment", "entrypoint"], rows))
    return 0


@_usage_errors
def cmd_stop(args: argparse.Namespace) -> int:
    client = JobsClient(args.address, args.auth_token_file)
    status = job_status(client, args.job)
    if status in TERMINAL:
        print(f"job {args.job} is not running ({status})")
        return 0
    client.stop_job(args.job)
    if args.no_wait:
        print(f"job {args.job}: stop requested")
        return 0
    status = wait_terminal(client, args.job, timeout=args.timeout)
    if status in TERMINAL:
        print(f"job {args.job} {status}")
        return 0
    print(f"job {args.job} still {status} after {args.timeout:.0f} s; Ray kills it after its "
          f"grace period", file=sys.stderr)
    return 1
