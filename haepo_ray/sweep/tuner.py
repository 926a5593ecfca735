"""A sweep spec -> ``ray.tune.Tuner``: build, run, resume, dry-run, best-trial summary.

Where things go (``<root>`` = ``--storage-path``, else the spec's ``storage_path``, else
``<cwd>/.haepo/ray_results``):

- each run of a spec is a Tune experiment in ``<root>/<experiment>/<YYYYmmdd-HHMMSS>``
  (``<experiment>`` = ``--experiment``, else the spec's ``name``); ``--resume`` continues the
  newest one that Tune can restore;
- MLflow: experiment ``<experiment>``, one parent run per sweep run, one child per trial
  (:mod:`haepo_ray.tracking`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from haepo_ray.sweep import spec as spec_mod
from haepo_ray.sweep.spec import PBTScheduler, SpecError, SweepSpec

logger = logging.getLogger(__name__)

DEFAULT_STORAGE = Path(".haepo") / "ray_results"
RUN_INFO_FILE = "haepo_sweep.json"


class SweepError(RuntimeError):
    """A sweep that cannot start or resume (bad path, nothing to resume, ...)."""


# --------------------------------------------------------------------------- paths


def experiment_root(spec: SweepSpec, experiment: str | None = None, storage_path: str | None = None) -> str:
    root = storage_path or spec.storage_path or str(Path.cwd() / DEFAULT_STORAGE)
    if "://" not in root:
        root = str(Path(root).expanduser().resolve())
    return f"{root.rstrip('/')}/{experiment or spec.experiment}"


def new_run_name() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def latest_run_dir(root: str) -> str | None:
    """The newest sweep run under ``root`` that Tune can restore."""
    from ray import tune

    if "://" in root:
        import pyarrow.fs

        fs, path = pyarrow.fs.FileSystem.from_uri(root)
        infos = fs.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True))
        scheme = root.split("://", 1)[0]
        names = sorted((i.base_name for i in infos if i.type == pyarrow.fs.FileType.Directory), reverse=True)
        candidates = [f"{scheme}://{path.rstrip('/')}/{n}" for n in names]
    else:
        base = Path(root)
        names = sorted((p.name for p in base.iterdir() if p.is_dir()), reverse=True) if base.is_dir() else []
        candidates = [str(base / n) for n in names]
    for path in candidates:
        if tune.Tuner.can_restore(path):
            return path
    return None


# --------------------------------------------------------------------------- Tune pieces


def search_algorithm(spec: SweepSpec):
    from ray.tune.search.basic_variant import BasicVariantGenerator

    if spec.search.algorithm == "optuna":
        import optuna
        from ray.tune.search import ConcurrencyLimiter
        from ray.tune.search.optuna import OptunaSearch

        searcher = OptunaSearch(sampler=optuna.samplers.TPESampler(seed=spec.search.seed))
        if spec.max_concurrent_trials:
            return ConcurrencyLimiter(searcher, max_concurrent=spec.max_concurrent_trials)
        return searcher
    return BasicVariantGenerator(random_state=spec.search.seed,
                                 max_concurrent=spec.max_concurrent_trials or 0)


class TrialNamer:
    """``<algorithm>_<env>_<trial id>`` (Tune's own format, whichever trainable runs it)."""

    def __init__(self, algorithm: str, env: str):
        self.prefix = f"{algorithm}_{env}".replace("/", "_")

    def __call__(self, trial) -> str:
        return f"{self.prefix}_{trial.trial_id}"


def trainable_name(spec: SweepSpec) -> str:
    """The Tune trainable a sweep runs: its algorithm in a :class:`~haepo_ray.sweep.trainable.SweepTrainable`
    (reusable,
    the spec's metric in every result), registered here under ``<algorithm>-sweep``."""
    from ray.tune.registry import register_trainable

    from haepo_ray.sweep.trainable import sweep_trainable

    name = f"{spec.algorithm}-sweep"
    register_trainable(name, sweep_trainable(spec.algorithm, spec.metric))
    return name


def scheduler(spec: SweepSpec):
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, PopulationBasedTraining

    s = spec.scheduler
    if s.type == "asha":
        return ASHAScheduler(time_attr="training_iteration", max_t=s.max_t,
                             grace_period=s.grace_period, reduction_factor=s.reduction_factor)
    if s.type == "pbt":
        import random

        if s.seed is not None:  # PBT draws with the module-level `random`
            random.seed(s.seed)
        return PopulationBasedTraining(
            time_attr="training_iteration",
            perturbation_interval=s.perturbation_interval,
            hyperparam_mutations=spec_mod.mutation_space(spec),
            quantile_fraction=s.quantile_fraction,
            resample_probability=s.resample_probability,
        )
    return FIFOScheduler()


def tune_config(spec: SweepSpec):
    from ray import tune

    return tune.TuneConfig(
        metric=spec.metric,
        mode=spec.mode,
        num_samples=spec.search.num_samples,
        search_alg=search_algorithm(spec),
        scheduler=scheduler(spec),
        reuse_actors=spec.reuse_actors,
        trial_name_creator=TrialNamer(spec.algorithm, spec.env),
    )


def progress_reporter(spec: SweepSpec):
    """The live trial table: search values, iteration, time, env steps, the metric."""
    from ray import tune

    metrics = {
        "training_iteration": "iter",
        "time_total_s": "time (s)",
        "env_runners/num_env_steps_sampled_lifetime": "env steps",
        "env_runners/episode_return_mean": "return",
    }
    metrics.setdefault(spec.metric, spec.metric.rsplit("/", 1)[-1])
    params = {key: name for name, key in spec_mod.search_keys(spec).items()}
    if isinstance(spec.scheduler, PBTScheduler):
        params.update({k: k for k in spec_mod.mutation_space(spec)})
    return tune.CLIReporter(
        metric_columns=metrics,
        parameter_columns=params,
        max_report_frequency=10,
        max_progress_rows=20,
        sort_by_metric=True,
    )


def run_config(spec: SweepSpec, *, storage_path: str, name: str, callbacks: list, verbose: int = 1):
    from ray import tune

    return tune.RunConfig(
        progress_reporter=progress_reporter(spec),
        name=name,
        storage_path=storage_path,
        stop=spec.stop_dict(),
        callbacks=callbacks,
        checkpoint_config=tune.CheckpointConfig(
            checkpoint_frequency=spec.checkpoint_frequency,
            checkpoint_at_end=spec.checkpoint_at_end,
            num_to_keep=spec.keep_checkpoints,
        ),
        failure_config=tune.FailureConfig(max_failures=spec.max_failures),
        verbose=verbose,
    )


def search_value_keys(spec: SweepSpec) -> dict[str, str]:
    """Spec search-space name (and, under PBT, each mutated config key) -> key in the trial
    config: the names of a trial's search values in its summary and in MLflow."""
    keys = spec_mod.search_keys(spec)
    if isinstance(spec.scheduler, PBTScheduler):
        keys.update({k: k for k in spec_mod.mutation_space(spec)})
    return keys


def make_callback(spec: SweepSpec, *, tracking_uri: str, experiment: str, sweep_name: str,
                  sweep_dir: str, resume: bool, spec_text: str | None, address: str | None,
                  **retry):
    """The MLflow callback of a sweep; ``retry``: ``retries``, ``backoff_s``, ``timeout_s``
    (see :class:`haepo_ray.tracking.RetryPolicy`)."""
    from haepo_ray import names, tracking

    params = {
        "algorithm": spec.algorithm,
        "env": spec.env,
        "env_config": spec.env_config,
        "metric": spec.metric,
        "mode": spec.mode,
        "search_algorithm": spec.search.algorithm,
        "num_samples": spec.search.num_samples,
        "scheduler": spec.scheduler.type,
        "stop": spec.stop_dict(),
        "search_space": {k: d.describe() for k, d in spec.search_space.items()},
        "settings": spec.settings,
        "max_failures": spec.max_failures,
        "max_concurrent_trials": spec.max_concurrent_trials,
        "checkpoint_frequency": spec.checkpoint_frequency,
    }
    config_metrics = list(spec_mod.mutation_space(spec)) if isinstance(spec.scheduler, PBTScheduler) else []
    settings = tracking.SweepTracking(
        tracking_uri=tracking_uri,
        experiment_name=experiment,
        sweep_name=sweep_name,
        sweep_dir=sweep_dir,
        resume=resume,
        artifact_location=tracking.artifact_location_for(tracking_uri),
        parent_params=params,
        parent_tags={
            names.ALGORITHM: spec.algorithm,
            names.ENV: spec.env,
            names.SPEC: spec.source or "",
            names.RAY_ADDRESS: address or "embedded",
        },
        spec_yaml=spec.resolved_yaml(),
        spec_source=spec_text,
        trial_tags={names.ALGORITHM: spec.algorithm, names.ENV: spec.env},
        search_keys=search_value_keys(spec),
        metric=spec.metric,
        mode=spec.mode,
        metrics=spec.tracking.metrics,
        config_metrics=config_metrics,
        log_checkpoints=spec.tracking.log_checkpoints,
    )
    return tracking.MLflowSweepCallback(settings, tracking.RetryPolicy.from_env(**retry))


# --------------------------------------------------------------------------- Ray


def init_ray(spec: SweepSpec, address: str | None) -> bool:
    """Connects to ``address``, or starts an embedded local Ray. True if we started/joined it
    here (and so shut it down at the end); False if Ray was already initialised."""
    import ray

    if ray.is_initialized():
        return False
    if address and address.startswith("ray://"):
        raise SweepError(
            f"--address {address}: Ray Client addresses are not supported (the sweep's driver, "
            "which logs to MLflow, must run inside the cluster); submit it as a job instead: "
            "ray job submit --address http://HEAD:8265 -- haepo sweep SPEC --address auto")
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(address="local", num_cpus=spec.ray.num_cpus, num_gpus=spec.ray.num_gpus,
                 include_dashboard=False, log_to_driver=False)
    return True


# --------------------------------------------------------------------------- trials (dry-run)


@dataclass
class PlannedTrial:
    index: int
    values: dict[str, Any]  # spec search-space name -> value


def planned_trials(spec: SweepSpec) -> list[PlannedTrial] | None:
    """The trials a grid/random search will run, as Tune will generate them (None for
    Optuna: it suggests as it goes). Random draws are reproduced exactly when
    ``search.seed`` is set; without it they are examples."""
    if spec.search.algorithm == "optuna":
        return None
    from ray.tune.search.sample import _BackwardsCompatibleNumpyRng
    from ray.tune.search.variant_generator import generate_variants

    keys = spec_mod.search_keys(spec)
    # What BasicVariantGenerator does: the whole config, in its order, one random state.
    rng = _BackwardsCompatibleNumpyRng(spec.search.seed)
    space = spec_mod.param_space(spec)
    trials: list[PlannedTrial] = []
    for _ in range(spec.search.num_samples):
        for _, resolved in generate_variants({"config": space}, random_state=rng):
            values = {name: resolved["config"][key] for name, key in keys.items()}
            trials.append(PlannedTrial(len(trials), values))
    return trials


def trial_resources(spec: SweepSpec, values: dict[str, Any] | None = None) -> dict[str, float]:
    """Total resources one trial asks Ray for (main process + env runners + learners)."""
    from haepo_ray.registry import algorithm_class

    config = spec_mod.algo_config(spec, values or {}, validate=False)
    pgf = algorithm_class(spec.algorithm).default_resource_request(config)
    total: dict[str, float] = {}
    for bundle in pgf.bundles:
        for key, value in bundle.items():
            total[key] = total.get(key, 0) + value
    return {k: v for k, v in total.items() if v}


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def format_table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    sep = "  ".join("-" * w for w in widths)
    body = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    return "\n".join([line, sep, *body])


def dry_run(spec: SweepSpec, *, out: TextIO = sys.stdout, experiment: str | None = None,
            storage_path: str | None = None, tracking_uri: str | None = None,
            address: str | None = None) -> list[PlannedTrial] | None:
    """Prints the resolved sweep (every trial with its values and resources); starts nothing.
    Every planned trial's config is validated; a bad one raises SpecError naming it."""
    from haepo_ray import tracking

    trials = planned_trials(spec)
    for t in trials or []:  # before anything builds a trial's config (resources do)
        try:
            spec_mod.algo_config(spec, t.values)
        except SpecError as err:
            raise SpecError(f"{spec.source}: trial {t.index} {t.values}: {err}") from None
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(f"sweep {spec.source or spec.experiment}: {spec.algorithm} on {spec.env} {spec.env_config or ''}")
    p(f"  search: {spec.search.algorithm}, num_samples {spec.search.num_samples}"
      + (f", seed {spec.search.seed}" if spec.search.seed is not None else ""))
    sched = spec.scheduler.model_dump(mode="json")
    if "mutations" in sched:
        sched["mutations"] = {k: f"{d['kind']} {d['values']}" for k, d in sched["mutations"].items()}
    p(f"  scheduler: {sched}")
    p(f"  metric: {spec.metric} ({spec.mode});  stop: {spec.stop_dict()}")
    p(f"  per trial: {trial_resources(spec, trials[0].values if trials else {})};  "
      f"max concurrent: {spec.max_concurrent_trials or 'as resources allow'};  "
      f"retries: {spec.max_failures};  checkpoint every {spec.checkpoint_frequency or '-'} "
      f"iterations{', and at the end' if spec.checkpoint_at_end else ''}")
    p(f"  Ray: {address or 'embedded local Ray'};  results: "
      f"{experiment_root(spec, experiment, storage_path)}/<run>")
    p(f"  MLflow: {tracking.resolve_tracking_uri(tracking_uri, create=False)} (experiment "
      f"{experiment or spec.experiment!r})")
    if trials is None:
        p(f"  {spec.search.num_samples} trials suggested by Optuna TPE from:")
        for name, dim in spec.search_space.items():
            p(f"    {name}: {dim.describe()}")
        spec_mod.algo_config(spec, {})
        return None
    names = list(spec.search_space)
    random = any(d.kind not in ("grid",) for d in spec.search_space.values())
    p(f"  {len(trials)} trials" + (" (random draws: examples, set search.seed to fix them)"
                                   if random and spec.search.seed is None else "") + ":")
    p(format_table(["trial"] + names, [[t.index] + [t.values[n] for n in names] for t in trials]))
    return trials


# --------------------------------------------------------------------------- run


@dataclass
class TrialSummary:
    trial_id: str
    name: str
    status: str
    iterations: int
    value: float | None
    values: dict[str, Any]
    run_id: str | None
    num_failures: int = 0
    error: str | None = None


@dataclass
class SweepResult:
    run_dir: str
    experiment: str
    tracking_uri: str | None
    parent_run_id: str | None
    metric: str
    mode: str
    trials: list[TrialSummary] = field(default_factory=list)
    not_logged: list = field(default_factory=list)
    result_grid: Any = None

    @property
    def best(self) -> TrialSummary | None:
        from haepo_ray.tracking import best

        return best(self.trials, lambda t: t.value, self.mode)

    def ranked(self) -> list[TrialSummary]:
        """Best first (the rule MLflow's parent run records), then trials without a value."""
        from haepo_ray.tracking import rank

        return rank(self.trials, lambda t: t.value, self.mode)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_dir": self.run_dir, "experiment": self.experiment, "tracking_uri": self.tracking_uri,
            "parent_run_id": self.parent_run_id, "metric": self.metric, "mode": self.mode,
            "best_trial_id": self.best.trial_id if self.best else None,
            "trials": [t.__dict__ for t in self.ranked()],
        }


def summarize(spec: SweepSpec, grid, callback, run_dir: str, experiment: str) -> SweepResult:
    from haepo_ray.tracking import metric_value

    result = SweepResult(
        run_dir=run_dir, experiment=experiment,
        tracking_uri=callback.tracking_uri if callback else None,
        parent_run_id=callback.parent_run_id if callback else None,
        metric=spec.metric, mode=spec.mode, result_grid=grid,
        not_logged=list(callback.not_logged) if callback else [],
    )
    keys = search_value_keys(spec)
    for trial in grid._experiment_analysis.trials:  # Tune's Trial objects, in creation order
        last = trial.last_result or {}
        config = trial.config or {}
        error = None
        if trial.status == "ERROR":
            error = "error"
            path = getattr(trial, "error_file", None)
            if path and os.path.exists(path):
                lines = Path(path).read_text(errors="replace").strip().splitlines()
                error = (lines[-1] if lines else "error")[:300]
        result.trials.append(TrialSummary(
            trial_id=trial.trial_id,
            name=str(trial),
            status=trial.status,
            iterations=int(last.get("training_iteration", 0) or 0),
            value=metric_value(last, spec.metric),
            values={name: config.get(key) for name, key in keys.items()},
            run_id=callback.run_id_of(trial.trial_id) if callback else None,
            num_failures=int(getattr(trial, "num_failures", 0) or 0),
            error=error,
        ))
    return result


def format_summary(result: SweepResult, top: int = 10) -> str:
    lines = [f"sweep finished: {len(result.trials)} trials, results in {result.run_dir}"]
    if result.parent_run_id:
        lines.append(f"MLflow: {result.tracking_uri}  experiment {result.experiment!r}  "
                     f"parent run {result.parent_run_id}")
    ranked = result.ranked()[:top]
    names = sorted({k for t in ranked for k in t.values})
    rows = [[i + 1, t.trial_id, t.status, t.iterations, t.value if t.value is not None else "-"]
            + [t.values.get(n) for n in names] + [t.run_id or "-"] for i, t in enumerate(ranked)]
    lines.append(f"best trials by {result.metric} ({result.mode}, last reported value):")
    lines.append(format_table(["rank", "trial", "status", "iter", result.metric] + names + ["mlflow run"], rows))
    errors = [t for t in result.trials if t.error]
    for t in errors:
        lines.append(f"trial {t.trial_id} failed: {t.error}")
    return "\n".join(lines)


def run_sweep(
    spec: SweepSpec,
    *,
    address: str | None = None,
    tracking_uri: str | None = None,
    experiment: str | None = None,
    resume: bool = False,
    storage_path: str | None = None,
    track: bool = True,
    verbose: int = 1,
    out: TextIO = sys.stdout,
    spec_text: str | None = None,
    callback_kwargs: dict[str, Any] | None = None,
    extra_callbacks: list | None = None,
) -> SweepResult:
    """Runs (or with ``resume`` continues) the sweep; returns its summary.

    ``callback_kwargs`` set the MLflow callback's :class:`haepo_ray.tracking.RetryPolicy`
    (``retries``, ``backoff_s``, ``timeout_s``); ``extra_callbacks`` are more Tune callbacks."""
    import ray
    from ray import tune

    from haepo_ray import tracking

    experiment = experiment or spec.experiment
    root = experiment_root(spec, experiment, storage_path)
    p = lambda *a: print(*a, file=out, flush=True)  # noqa: E731

    started_ray = init_ray(spec, address)
    callback = None
    try:
        from haepo_ray.envs import register_with_ray

        register_with_ray()  # so PPO (and any algorithm) trials can make the haepo envs
        if resume:
            run_dir = latest_run_dir(root)
            if run_dir is None:
                raise SweepError(f"nothing to resume under {root}: no sweep there that Ray Tune "
                                 "can restore (run it without --resume)")
            name = run_dir.rstrip("/").rsplit("/", 1)[-1]
        else:
            name = new_run_name()
            run_dir = f"{root}/{name}"
            while os.path.exists(run_dir):  # two sweeps in one second
                time.sleep(1.0)
                name = new_run_name()
                run_dir = f"{root}/{name}"

        uri = tracking.resolve_tracking_uri(tracking_uri) if track else None
        if track:
            p(f"MLflow tracking URI: {uri} (experiment {experiment!r})")
            callback = make_callback(spec, tracking_uri=uri, experiment=experiment,
                                     sweep_name=f"{experiment}-{name}", sweep_dir=run_dir,
                                     resume=resume, spec_text=spec_text, address=address,
                                     **(callback_kwargs or {}))
            if callback.start():
                p(f"MLflow parent run: {callback.parent_run_id}")
        callbacks = ([callback] if callback else []) + list(extra_callbacks or [])
        p(f"Ray Tune results: {run_dir}" + (" (resuming)" if resume else ""))

        trainable = trainable_name(spec)
        space = spec_mod.param_space(spec)
        if resume:
            tuner = tune.Tuner.restore(run_dir, trainable=trainable, param_space=space,
                                       resume_errored=True)
            # tuner.pkl holds the callbacks of the first run (unstarted copies): use ours.
            tuner._local_tuner.get_run_config().callbacks = callbacks
        else:
            tuner = tune.Tuner(
                trainable,
                param_space=space,
                tune_config=tune_config(spec),
                run_config=run_config(spec, storage_path=root, name=name, callbacks=callbacks,
                                      verbose=verbose),
            )
            _write_run_info(run_dir, spec, experiment, uri, callback)
        # Tune's newer output prints every trial's whole config (hundreds of RLlib keys) when
        # it starts; the classic reporter shows the table of progress_reporter() instead.
        saved = os.environ.get("RAY_AIR_NEW_OUTPUT")
        os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
        try:
            grid = tuner.fit()
        finally:
            if saved is None:
                os.environ.pop("RAY_AIR_NEW_OUTPUT", None)
            else:
                os.environ["RAY_AIR_NEW_OUTPUT"] = saved
            if callback is not None:
                callback.close(status="KILLED")  # no-op when Tune ended the experiment itself
        result = summarize(spec, grid, callback, run_dir, experiment)
        p(format_summary(result))  # (what MLflow missed was logged as a warning, to stderr)
        _write_summary(run_dir, result)
        return result
    finally:
        if started_ray:
            ray.shutdown()


def _write_run_info(run_dir: str, spec: SweepSpec, experiment: str, uri: str | None, callback) -> None:
    if "://" in run_dir:
        return
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    info = {"spec": spec.source, "experiment": experiment, "tracking_uri": uri,
            "parent_run_id": callback.parent_run_id if callback else None}
    (path / RUN_INFO_FILE).write_text(json.dumps(info, indent=2))
    (path / "spec.yaml").write_text(spec.resolved_yaml())


def _write_summary(run_dir: str, result: SweepResult) -> None:
    if "://" in run_dir:
        return
    try:
        (Path(run_dir) / "haepo_summary.json").write_text(json.dumps(result.to_dict(), indent=2, default=str))
    except OSError as err:  # pragma: no cover
        logger.warning("cannot write the sweep summary: %s", err)
