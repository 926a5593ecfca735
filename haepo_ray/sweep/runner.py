"""Running a sweep: Ray start-up, the sweep's folder, MLflow tracking, Tune's run or resume.

Where things go:

- each run of a spec is a Tune experiment in a folder of its own
  (:mod:`haepo_ray.sweep.paths`); ``--resume`` continues the newest one that Tune can restore;
- MLflow: experiment ``<experiment>``, one parent run per sweep run, one child per trial
  (:mod:`haepo_ray.tracking`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, TextIO

import yaml

from haepo_ray.sweep import results, tune_setup
from haepo_ray.sweep.cluster import HEAD_HINT, Cluster, head_problem
from haepo_ray.sweep.interrupt import InterruptWatch, sigterm_grace_s
from haepo_ray.sweep.metric_watch import MetricWatch
from haepo_ray.sweep.paths import check_root, experiment_root, latest_run_dir, new_run_dir
from haepo_ray.sweep.plan_base import Plan
from haepo_ray.sweep.planned import checked_trials
from haepo_ray.sweep.spec import SweepSpec
from haepo_ray import upstream
from haepo_ray.upstream import tune as tune_internals
from haepo_ray.upstream import tune_restore
from haepo_ray.ray_start import start_ray
from haepo_ray.terminated import sigterm_raises_terminated
from haepo_ray.uris import is_uri

RUN_INFO_FILE = "haepo_sweep.json"
SPEC_FILE = "spec.yaml"  # in a run's folder: the spec it started with, every default filled in
# Spec keys a resume may change: where the run is, what it is called, this session's Ray.
RESUME_MAY_CHANGE = ("name", "description", "storage_path", "ray")


class SweepError(RuntimeError):
    """A sweep that cannot start or resume (bad path, nothing to resume, ...)."""


# --------------------------------------------------------------------------- Ray


def init_ray(spec: SweepSpec, address: str | None) -> bool:
    """Connects to ``address``, or starts an embedded local Ray. True if we started/joined it
    here (and so shut it down at the end); False if Ray was already initialised. On a cluster the
    trials' actors get this process's patch setting (:func:`actor_env_vars`)."""
    import ray

    problem = head_problem(address) if address else None
    if problem:
        raise SweepError(problem)
    if ray.is_initialized():
        return False
    if address:
        env_vars = actor_env_vars()
        try:
            start_ray(address=address, log_to_driver=False, runtime_env={"env_vars": env_vars} if env_vars else None)
        except ConnectionError as err:  # something answers there, but not a Ray head; or auto found none
            hint = "start Ray on this node first (ray start), or give the head's HOST:6379" if address == "auto" \
                else HEAD_HINT
            raise SweepError(f"--address {address}: {str(err).rstrip('.')}: {hint}") from None
    else:
        start_ray(address="local", num_cpus=spec.ray.num_cpus, num_gpus=spec.ray.num_gpus,
                  include_dashboard=False, log_to_driver=False)
    return True


def actor_env_vars() -> dict[str, str]:
    """The variables a cluster's actors need from this process's environment: the patch setting
    (``HAEPO_PATCHES``; the connectors patch and the env runners' overrides are checked and
    applied inside the trials' actors), where it is set here and a submitted job's runtime
    environment does not already set it (Ray refuses a variable set by both; ``haepo submit``
    sets it there)."""
    from haepo_ray.upstream.core import job_env_vars

    value = os.environ.get(upstream.PATCHES_SETTING)
    if value is None or upstream.PATCHES_SETTING in job_env_vars():
        return {}
    return {upstream.PATCHES_SETTING: value}


# --------------------------------------------------------------------------- tracking


def make_callback(plan: Plan, *, tracking_uri: str, experiment: str, sweep_name: str,
                  sweep_dir: str, resume: bool, spec_text: str | None, address: str | None,
                  untested: list[str] | None = None, interrupted=None, **retry):
    """The sweep's MLflow callback: one parent run, one child per trial; ``untested``: the
    warnings of patches run on an untested library version (:func:`haepo_ray.upstream.check`),
    a tag of the parent run; ``interrupted``: the callback's (the trials' statuses at a Ctrl-C);
    ``retry``: ``retries``, ``backoff_s``, ``timeout_s``, ``close_timeout_s``
    (:class:`haepo_ray.tracking.RetryPolicy`)."""
    from haepo_ray import names, tracking
    from haepo_ray.provenance import provenance

    spec = plan.spec
    algorithm = spec.algorithm or ",".join(map(str, spec.search_space["algorithm"].values))
    subject, subject_tags = plan.subject
    params = {
        "algorithm": algorithm,
        **subject,
        "metric": spec.metric,
        "mode": spec.mode,
        "search_algorithm": spec.search.algorithm,
        "num_samples": spec.search.num_samples,
        "scheduler": spec.scheduler.type,
        "stop": plan.stop_dict(),
        "search_space": {k: d.describe() for k, d in spec.search_space.items()},
        "settings": spec.settings,
        "max_failures": spec.max_failures,
        "max_concurrent_trials": spec.max_concurrent_trials,
        "checkpoint_frequency": spec.checkpoint_frequency,
    }
    settings = tracking.SweepTracking(
        tracking_uri=tracking_uri,
        experiment_name=experiment,
        sweep_name=sweep_name,
        sweep_dir=sweep_dir,
        resume=resume,
        artifact_location=tracking.artifact_location_for(tracking_uri),
        parent_params=params,
        parent_tags={
            **provenance(),  # the driver's; each trial's run gets its own from its results
            names.ALGORITHM: algorithm,
            **subject_tags,
            names.SPEC: spec.source or "",
            names.RAY_ADDRESS: address or "embedded",
            **({names.UNTESTED_UPSTREAM: " ".join(untested)} if untested else {}),
        },
        spec_yaml=spec.resolved_yaml(),
        spec_source=spec_text,
        trial_tags={names.ALGORITHM: algorithm, **subject_tags},
        search_keys=plan.search_keys,
        metric=spec.metric,
        mode=spec.mode,
        metrics=plan.logged_metrics,
        config_metrics=list(plan.mutations),
        log_checkpoints=spec.tracking.log_checkpoints,
        step_key=plan.step_key,
        config_tags=plan.trial_tags,
        checkpoint_root_files=plan.root_files,
        default_params=plan.default_params(),
    )
    return tracking.MLflowSweepCallback(settings, tracking.RetryPolicy.from_env(**retry), interrupted)


# --------------------------------------------------------------------------- run


def _restored_tuner(run_dir: str, trainable: str, param_space: dict, callbacks: list):
    """The Tuner of an earlier run, with this run's callbacks (tuner.pkl holds the first
    run's callbacks, unstarted copies), and without the analysis of every trial's results that
    Tune would read first (:func:`~haepo_ray.upstream.tune.restoring_without_analysis`)."""
    from ray import tune

    with tune_internals.restoring_without_analysis():
        tuner = tune.Tuner.restore(run_dir, trainable=trainable, param_space=param_space,
                                   resume_errored=True)
    tune_internals.set_restored_callbacks(tuner, callbacks)
    return tuner


def refuse_a_foreign_state(run_dir: str, name: str, state: str) -> None:
    """Raises :class:`SweepError` when ``state``, the experiment state a resume of ``run_dir``
    (named ``name``) would restore, holds trials of another experiment folder: Tune would move
    their checkpoints' paths into ``run_dir``, where they are not, and fail or restart each
    trial. A folder moved whole keeps its name, and Tune follows it."""
    trials = tune_restore.state_trials(run_dir, state)
    if trials is None:
        return
    foreign = sorted({t.experiment_folder for t in trials if t.experiment_name != name})
    if foreign:
        raise SweepError(
            f"cannot resume {run_dir}: the experiment state it would restore, {state}, holds trials of "
            f"another experiment folder, {', '.join(foreign)} (a state file copied from there?). Ray Tune "
            f"would look for their checkpoints in {run_dir}, where they are not. Move that file out of "
            f"{run_dir} to resume it from its own newest experiment state, or resume the other folder's sweep")


def refuse_a_changed_spec(run_dir: str, spec: SweepSpec) -> None:
    """Raises :class:`SweepError` when ``spec`` differs from the one the sweep in ``run_dir``
    started with (its :data:`SPEC_FILE`) in a key not in :data:`RESUME_MAY_CHANGE`: Tune
    restores a run as it was started, and would ignore the change (a longer stop, another
    grid, a new metric) without a word. Nothing to compare (a folder on remote storage, or
    one without the file): no check."""
    from haepo_ray.sweep.kinds import parse_spec
    from haepo_ray.tracking.schema import flatten

    path = Path(run_dir) / SPEC_FILE
    if is_uri(run_dir) or not path.is_file():
        return
    started = parse_spec(yaml.safe_load(path.read_text()), str(path))
    before, now = (flatten({k: v for k, v in yaml.safe_load(s.resolved_yaml()).items()
                            if k not in RESUME_MAY_CHANGE}, sep=".") for s in (started, spec))
    missing = "(not set)"
    changed = [f"{key}: {before.get(key, missing)} -> {now.get(key, missing)}"
               for key in sorted(before.keys() | now.keys()) if before.get(key, missing) != now.get(key, missing)]
    if changed:
        raise SweepError(
            f"cannot resume {run_dir} with this spec: it changed since the sweep started ({'; '.join(changed)}). "
            "Ray Tune resumes a sweep as it was started and would ignore the change. Run the changed spec "
            f"without --resume (a new run of it), or resume with the spec it started with ({path})")


def result_loggers() -> list:
    """The one per-trial result logger a sweep keeps: Tune's JSON logger (params.json,
    params.pkl, result.json), which resumes read (:mod:`haepo_ray.tracking.trial_files`) and
    ``Result.metrics_dataframe`` prefers. Tune's CSV (progress.csv) and TensorBoard loggers
    are left out: nothing reads them, and on the driver they cost about 35-50 ms per trial
    (bench/scale.py's profile; BENCHMARKS.md, "Sweeps of thousands of trials")."""
    from ray.tune.logger import JsonLoggerCallback

    return [JsonLoggerCallback()]


def _summary(plan: Plan, trials: list, grid, callback, run_dir: str, experiment: str, watch: InterruptWatch,
             out: TextIO) -> results.SweepResult:
    """The sweep's summary, printed to ``out`` and written to ``haepo_summary.json``."""
    result = results.summarize(plan, trials, grid, callback, run_dir, experiment, watch.statuses, watch.signal)
    print(results.format_summary(result), file=out, flush=True)  # (what MLflow missed: a warning, to stderr)
    results.write_summary(run_dir, result)
    return result


def _end_after_sigterm(plan: Plan, trials: list, callback, run_dir: str, experiment: str, watch: InterruptWatch,
                       out: TextIO) -> None:
    """Ends a sweep that Ray can no longer end after a SIGTERM (Ray's own processes got it too):
    the MLflow runs of the running trials and the parent end KILLED, the summary says so, then
    the process ends, 143."""
    if callback is not None:
        callback.on_experiment_end(trials=trials)
    print("Ray's own processes got the SIGTERM too: the sweep is ended without them", file=out)
    _summary(plan, trials, None, callback, run_dir, experiment, watch, out)
    sys.stderr.flush()
    os._exit(128 + signal.SIGTERM)


def _fit(tuner):
    """``tuner.fit()`` with Tune's classic output (its newer output prints every trial's
    whole config, hundreds of RLlib keys, at start; the classic reporter shows the table of
    :func:`~haepo_ray.sweep.tune_setup.progress_reporter` instead) and without Tune's
    automatic loggers (the run's callbacks hold :func:`result_loggers`), and with the patches
    of :mod:`haepo_ray.upstream.tune` (the actors Tune launches kept, the experiment's
    folder copied file by file whole, a run that cannot be restored a :class:`SweepError`)."""
    tune_internals.apply()
    settings = tune_internals.CLASSIC_OUTPUT
    saved = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    try:
        return tuner.fit()
    except tune_restore.RestoreFailed as failed:
        path, state, error = failed.args
        raise SweepError(
            f"cannot resume {path}: Ray Tune could not restore it from {state} "
            f"({type(error).__name__}: {error}), and would start every trial again. A state file "
            "that is not whole JSON was cut short by a kill while Tune copied it (sweeps run "
            "before haepo-ray copied it whole): move it away to resume from an earlier "
            "experiment_state-*.json of the run, if there is one. Otherwise fix what the error "
            "names, or run the sweep anew without --resume") from error
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_sweep(
    plan: Plan,
    *,
    address: str | None = None,
    tracking_uri: str | None = None,
    experiment: str | None = None,
    resume: bool = False,
    storage_path: str | None = None,
    track: bool = True,
    verbose: int = 1,
    out: TextIO | None = None,
    spec_text: str | None = None,
    callback_kwargs: dict[str, Any] | None = None,
    extra_callbacks: list | None = None,
) -> results.SweepResult:
    """Runs (or with ``resume`` continues) the sweep; returns its summary. The patches the
    sweep applies are checked first, before anything is started or written
    (:func:`haepo_ray.upstream.check`: :class:`~haepo_ray.upstream.UpstreamVersionError` on an
    untested version it may not run on), then every planned trial's config (a SpecError names
    each bad one: :func:`~haepo_ray.sweep.planned.checked_trials`). SIGINT and SIGTERM stop it (the summary says which,
    and the trials it stopped); where Tune has not stopped the trials ``HAEPO_SIGTERM_GRACE_S``
    after a SIGTERM (Ray's own processes got it too), the sweep is ended without Ray and the
    process exits 143 (:mod:`haepo_ray.sweep.interrupt`).

    ``out``: where its lines go (``sys.stdout`` at the time of the call, by default);
    ``callback_kwargs`` set the MLflow callback's :class:`haepo_ray.tracking.RetryPolicy`
    (``retries``, ``backoff_s``, ``timeout_s``, ``close_timeout_s``); ``extra_callbacks`` are more Tune callbacks."""
    import ray
    from ray import tune

    from haepo_ray import tracking
    from haepo_ray.envs import register_with_ray

    spec = plan.spec
    experiment = experiment or spec.experiment
    root = experiment_root(spec, experiment, storage_path)
    out = out or sys.stdout
    p = lambda *a: print(*a, file=out, flush=True)  # noqa: E731

    untested = upstream.check(plan.patched)
    for line in untested:
        p(line)
    if resume:  # before Ray starts: what there is to resume needs only the results folder
        run_dir = latest_run_dir(root)
        if run_dir is None:
            raise SweepError(f"nothing to resume under {root}: no sweep there that Ray Tune "
                             "can restore (run it without --resume)")
        name = run_dir.rstrip("/").rsplit("/", 1)[-1]
        state = tune_restore.newest_state_file(run_dir)
        if state is None:  # Tune's restore would fail, after Ray's start
            raise SweepError(f"cannot resume {run_dir}: Ray Tune saved no state of that sweep (it was stopped "
                             "before its first save), so there is nothing to continue: run it anew without --resume")
        refuse_a_changed_spec(run_dir, spec)
        refuse_a_foreign_state(run_dir, name, state)
    checked_trials(plan)  # a trial whose config is wrong, refused before any starts
    try:
        check_root(root)
        uri = tracking.resolve_tracking_uri(tracking_uri, create=False) if track else None  # MLflow makes it
    except ValueError as err:
        raise SweepError(str(err)) from None
    started_ray = init_ray(spec, address)
    callback = None
    try:
        # Until Tune's InterruptWatch takes SIGTERM (during the fit), it is a Ctrl-C: Ray's handler
        # would abort the driver, its MLflow parent run left RUNNING.
        with sigterm_raises_terminated():
            plan = plan.fitted(Cluster.of_ray(embedded=address is None))  # GPUs there; LM trials' memory
            register_with_ray()  # so PPO (and any algorithm) trials can make the haepo envs
            if not resume:
                name, run_dir = new_run_dir(root)

            watch = InterruptWatch(on_stuck=lambda trials: _end_after_sigterm(plan, trials, callback, run_dir,
                                                                              experiment, watch, out),
                                   grace_s=sigterm_grace_s())
            if track:
                p(f"MLflow tracking URI: {uri} (experiment {experiment!r})")
                callback = make_callback(plan, tracking_uri=uri, experiment=experiment,
                                         sweep_name=f"{experiment}-{name}", sweep_dir=run_dir,
                                         resume=resume, spec_text=spec_text, address=address,
                                         untested=untested, interrupted=watch.at_interrupt, **(callback_kwargs or {}))
                if callback.start():
                    p(f"MLflow parent run: {callback.parent_run_id}")
            recorder = results.TrialRecorder()
            # The watch first: its end (Tune has stopped the trials) comes before MLflow's flush,
            # which may take longer than a SIGTERM's grace and must not be cut short by it.
            globs = (spec.tracking.metrics or ()) if callback else ()  # the spec's own, which MLflow logs
            callbacks = [watch] + ([callback] if callback else []) + list(extra_callbacks or []) \
                + [recorder, MetricWatch(spec.metric, plan.step_key, globs)] \
                + result_loggers() + tune_internals.sweep_callbacks()
            p(f"Ray Tune results: {run_dir}" + (" (resuming)" if resume else ""))

            if resume:
                tuner = _restored_tuner(run_dir, plan.trainable(), plan.param_space, callbacks)
            else:
                tuner = tune.Tuner(
                    plan.trainable(),
                    param_space=plan.param_space,
                    tune_config=tune_setup.tune_config(plan),
                    run_config=tune_setup.run_config(plan, storage_path=root, name=name,
                                                     callbacks=callbacks, verbose=verbose),
                )
                _write_run_info(run_dir, spec, experiment, uri, callback)
            try:
                grid = _fit(tuner)
            finally:
                watch.release()
                if callback is not None:
                    callback.close(status="KILLED")  # no-op when Tune ended the experiment itself
            return _summary(plan, recorder.trials, grid, callback, run_dir, experiment, watch, out)
    finally:
        if callback is not None:  # interrupted before the fit's end (a no-op once closed)
            callback.close(status="KILLED")
        if started_ray:
            ray.shutdown()


def _write_run_info(run_dir: str, spec: SweepSpec, experiment: str, uri: str | None, callback) -> None:
    if is_uri(run_dir):
        return
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    info = {"spec": spec.source, "experiment": experiment, "tracking_uri": uri,
            "parent_run_id": callback.parent_run_id if callback else None}
    (path / RUN_INFO_FILE).write_text(json.dumps(info, indent=2))
    (path / SPEC_FILE).write_text(spec.resolved_yaml())
