"""``haepo train``: one trial in an embedded Ray, progress per iteration, a final checkpoint,
logged to MLflow as one run (:class:`haepo_ray.tracking.MLflowRun`)."""

from __future__ import annotations

import argparse
import math
import pickle
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from haepo_ray import names
from haepo_ray.cli.args import add_experiment, add_tracking_uri, check_out_folder
from haepo_ray.cli.errors import UsageError, configure_logging
from haepo_ray.cli.signals import StopRequest
from haepo_ray.rl.evaluation import mark_stale_evaluation
from haepo_ray.sweep.spec import SpecError, StopSpec
from haepo_ray.sweep.spec_yaml import load_yaml

DEFAULT_EXPERIMENT = "train"
DEFAULT_ALGO = "HAEPO"
DEFAULT_SEED = 0
DEFAULT_STOP = StopSpec(iterations=100)
# StopSpec's criteria -> the options (argparse dests) that set them.
STOP_OPTIONS = {"iterations": "stop_iters", "seconds": "stop_time", "env_steps": "stop_env_steps",
                "episode_return_mean": "stop_return"}


def add_parser(subparsers) -> None:
    train = subparsers.add_parser("train", help="train one trial locally and write a checkpoint")
    train.add_argument("--env", help="a gymnasium id, e.g. CartPole-v1 or haepo/ChainMDP-v0 (with --restore: "
                                     "the checkpoint's)")
    train.add_argument("--algo", help="HAEPO (default), DPO, GRPO or an RLlib algorithm name, e.g. PPO (with "
                                      "--restore: the checkpoint's)")
    stop = train.add_argument_group("stop criteria (any that is met stops; default --stop-iters 100)")
    stop.add_argument("--stop-iters", type=int, help="training iterations")
    stop.add_argument("--stop-time", type=float, help="wall-clock seconds of training")
    stop.add_argument("--stop-env-steps", type=int, help="env steps sampled")
    stop.add_argument("--stop-return", type=float, help="mean episode return")
    train.add_argument("--seed", type=int, help="random seed (default 0; with --restore: the checkpoint's)")
    train.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="an algorithm setting, value in YAML, e.g. --set lr=0.01 (repeatable; with "
                            "--restore: over the checkpoint's settings)")
    train.add_argument("--checkpoint-dir", metavar="DIR",
                       help="a folder for the final checkpoint, not one that holds a checkpoint (default: "
                            ".haepo/checkpoints/ALGO-ENV-TIME)")
    train.add_argument("--restore", metavar="CHECKPOINT",
                       help="go on from a checkpoint of haepo train or of a sweep's trial, with its "
                            "settings: weights, optimizer, reference policy, env runners and iteration count "
                            "(the --stop-* criteria count from that run's start)")
    train.add_argument("--num-cpus", type=int, default=None, help="CPUs for the embedded Ray (default: all)")
    add_tracking_uri(train)
    add_experiment(train, help=f"MLflow experiment (default: {DEFAULT_EXPERIMENT})")
    train.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
    train.set_defaults(func=cmd_train)


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """``["lr=1e-3", "model_config={fcnet_hiddens: [128]}"]`` -> dict; values are YAML as a
    spec reads it (:func:`~haepo_ray.sweep.spec_yaml.load_yaml`: ``1e-3`` is a float)."""
    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--set expects key=value, got {pair!r}")
        if key in overrides:
            raise UsageError(f"--set {key} is given twice ({overrides[key]!r}, then {raw!r}): give it once")
        if key == "seed":  # else the run's name and MLflow tag would name --seed's, not the one it ran with
            raise UsageError(f"--set seed={raw.strip()}: give --seed {raw.strip()}")
        try:
            overrides[key] = load_yaml(raw, f"--set {key}")
        except SpecError as err:
            raise UsageError(f"{err} (the value {raw!r})") from None
    return overrides


def stop_spec(args: argparse.Namespace) -> StopSpec:
    """The run's stop rule from the ``--stop-*`` options (none given: :data:`DEFAULT_STOP`)."""
    given = {key: getattr(args, dest) for key, dest in STOP_OPTIONS.items() if getattr(args, dest) is not None}
    if not given:
        return DEFAULT_STOP
    try:
        return StopSpec(**given)
    except ValidationError as err:
        raise UsageError("; ".join(
            f"--{STOP_OPTIONS[e['loc'][0]].replace('_', '-')} {e['input']!r}: {e['msg']}" for e in err.errors()
        )) from None


def train_config(algo: str, env: str, seed: int | None, overrides: dict[str, Any]):
    """The validated AlgorithmConfig of ``haepo train`` (:func:`haepo_ray.rl.configs.build_config`)."""
    from haepo_ray.envs import check_env_id
    from haepo_ray.rl import configs
    from haepo_ray.rl.registry import UnknownAlgorithm

    try:
        check_env_id(env)
        config = configs.validate(configs.build_config(algo, env, seed=seed, settings=overrides))
    except (UnknownAlgorithm, ValueError) as err:
        raise UsageError(str(err)) from None
    return _checked_env_config(_read_overrides(config, overrides))


def _read_overrides(config, overrides: Mapping[str, Any]):
    """``config``, unless it would not read a setting ``--set`` gives (:func:`unread`): a usage error."""
    from haepo_ray.rl.unread import unread

    ignored = unread([config], overrides)
    if ignored:
        raise UsageError("\n".join(f"--set {name}: this run would not read it: {why}; leave it out"
                                   for name, why in ignored.items()))
    return config


def _checked_env_config(config):
    """``config``, once its env is made from its env_config here (:func:`env_spaces`) and its
    model built for the env's spaces (:func:`check_model`): a bad env_config, or spaces or a
    model_config the model cannot take, is a usage error, not a traceback from Ray's env runners."""
    from haepo_ray.envs import env_spaces
    from haepo_ray.rl.configs import check_model

    try:
        spaces = env_spaces(config.env, config.env_config)
    except ValueError as err:
        raise UsageError(f"env_config: {err}") from None
    try:
        check_model(config, *spaces)
    except ValueError as err:
        raise UsageError(str(err)) from None
    return config


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
    evaluation = result.get(names.EVALUATION, {}).get("env_runners", {})
    if "episode_return_mean" in evaluation and names.EVALUATION not in result.get(names.CARRIED_OVER, ()):
        parts.append(f"evaluation return {evaluation['episode_return_mean']:9.3f}")  # evaluated in this iteration
    parts.append(f"{result.get(names.TIME_THIS_ITER_S, 0.0):6.2f} s")
    return " | ".join(parts)


def _require_resources(args: argparse.Namespace, config, have: Mapping[str, float]) -> None:
    """A UsageError when the algorithm asks the local Ray (``have``: its resources) for more CPUs
    or GPUs than it has: its env runners or learners would wait for ever."""
    from haepo_ray.rl.configs import requested_resources
    from haepo_ray.sweep.cluster import Cluster

    local = Cluster(gpus=have.get("GPU", 0.0), cpus=have.get("CPU", 0.0))
    for resource, asked, has in local.lacks(requested_resources(config)):
        raise UsageError(
            f"{args.algo} asks for {asked:g} {resource}s (its main process, env runners and learners), but "
            f"the local Ray has {has:g}"
            + (" (--num-cpus)" if resource == "CPU" else "") + ": it would wait for ever. Ask for fewer "
            f"(--set num_env_runners=..., num_cpus_per_env_runner, num_gpus_per_learner)"
            + (" or give Ray more with --num-cpus" if resource == "CPU" else ""))


def restored_config(args: argparse.Namespace, overrides: dict[str, Any]):
    """The validated config of ``--restore``'s checkpoint, ``--seed`` and ``overrides`` over it;
    fills in ``args.algo``, ``args.env`` and ``args.seed`` from it, refusing ones that differ."""
    from haepo_ray.envs import check_env_id
    from haepo_ray.rl import configs
    from haepo_ray.rl.checkpoints import checkpoint_origin

    try:
        origin = checkpoint_origin(args.restore)
    except ValueError as err:
        raise UsageError(f"--restore {err}") from None
    algo = origin.algorithm.__name__
    if origin.env is None:
        raise UsageError(f"--restore {args.restore}: its env is not a registered id, which haepo train needs")
    if args.algo not in (None, algo) or args.env not in (None, origin.env):
        raise UsageError(f"--restore {args.restore} is a checkpoint of {algo} on {origin.env}, not of "
                         f"{args.algo or algo} on {args.env or origin.env}: leave out --algo and --env")
    args.algo, args.env = algo, origin.env
    config = origin.config.copy(copy_frozen=False)
    if args.seed is not None:
        config.debugging(seed=args.seed)
    args.seed = config.seed
    try:
        check_env_id(origin.env)
        config = configs.validate(configs.apply_settings(config, overrides))
    except ValueError as err:
        raise UsageError(str(err)) from None
    return _checked_env_config(_read_overrides(config, overrides))


def cmd_train(args: argparse.Namespace) -> int:
    configure_logging()
    stop = stop_spec(args)
    overrides = parse_overrides(args.set or [])
    if args.restore:
        config = restored_config(args, overrides)
    elif args.env is None:
        raise UsageError("give --env (or --restore a checkpoint)")
    else:
        args.algo, args.seed = args.algo or DEFAULT_ALGO, DEFAULT_SEED if args.seed is None else args.seed
        config = train_config(args.algo, args.env, args.seed, overrides)
    name = f"{args.algo}-{args.env.replace('/', '_')}-{time.strftime('%Y%m%d-%H%M%S')}"
    from haepo_ray.rl.checkpoints import METADATA_FILE

    # before training, which a checkpoint that cannot be written would lose
    out = check_out_folder(args.checkpoint_dir or Path(".haepo") / "checkpoints" / name, "--checkpoint-dir",
                           records=(METADATA_FILE,)).resolve()
    from haepo_ray import tracking, upstream

    try:  # HAEPO's env runner's overrides, before Ray starts (their warning is logged where they apply)
        upstream.check(("rllib",))
        uri = None if args.no_tracking else tracking.resolve_tracking_uri(args.tracking_uri)
    except (upstream.UpstreamVersionError, ValueError) as err:  # PatchSettingError is a ValueError
        raise UsageError(str(err)) from None
    import ray

    from haepo_ray.ray_start import start_ray
    from haepo_ray.sweep.interrupt import sigterm_grace_s

    start_ray(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    # Ctrl-C and SIGTERM stop the loop after its iteration (SIGTERM: not Ray's handler, which aborts)
    with StopRequest("haepo train", "after this iteration", sigterm_grace_s()) as request:
        algo = None
        try:
            _require_resources(args, config, ray.cluster_resources())
            algo = config.build_algo()
            if args.restore:  # its refusals come before the MLflow run, which would end FAILED
                _restore(algo, args, stop)
            run = None if uri is None or request.signum is not None else _start_run(args, uri, config, stop, name)
            _train(algo, stop, out, run, request)
        finally:
            if algo is not None:
                algo.stop()
            ray.shutdown()
    request.raise_if_received()
    return 0


def _train(algo, stop: StopSpec, out: Path, run, request: StopRequest) -> None:
    """Trains ``algo`` until ``stop`` or ``request``, saves its checkpoint in ``out`` (none before
    the first iteration, or on an interrupt at once) and ends ``run``."""
    status, checkpoint, error, result = "FAILED", None, None, None
    try:
        while request.signum is None:
            result = mark_stale_evaluation(algo.train(), algo.config)
            print(_progress_line(result), flush=True)
            if run is not None:
                run.log_result(result)
            if stop.reached(result):
                break
        if result is not None:
            algo.save_to_path(out)
            print(f"checkpoint: {out}")
            checkpoint = out
        status = "FINISHED" if request.signum is None else "KILLED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except Exception:
        error = traceback.format_exc()
        raise
    finally:
        if run is not None:
            from ray.train import Checkpoint

            run.end(status, Checkpoint.from_directory(checkpoint) if checkpoint else None, error)


def _restore(algo, args: argparse.Namespace, stop: StopSpec) -> None:
    """Restores ``algo`` from ``--restore``; a UsageError where its state does not fit, or where
    it has trained ``--stop-iters`` already."""
    try:
        algo.restore_from_path(Path(args.restore).resolve())
    except (pickle.UnpicklingError, EOFError) as err:
        raise UsageError(f"--restore {args.restore}: a state file in it is damaged or cut short "
                         f"({type(err).__name__}: {err})") from None
    except (ValueError, RuntimeError, KeyError) as err:
        raise UsageError(f"--restore {args.restore}: its state does not fit the {args.algo} these settings "
                         f"build (a --set that changes the model?). RLlib: {err}") from None
    print(f"restored: {args.restore} (iteration {algo.iteration})", flush=True)
    if stop.iterations is not None and algo.iteration >= stop.iterations:
        raise UsageError(f"--restore {args.restore} has trained {algo.iteration} iterations already: give "
                         f"--stop-iters above {algo.iteration} (the criteria count from its run's start)")


def _start_run(args: argparse.Namespace, uri: str, config, stop: StopSpec, name: str):
    """The run's MLflow run in the store at ``uri``, started (None when MLflow cannot be reached)."""
    from haepo_ray import tracking
    from haepo_ray.provenance import provenance

    experiment = args.experiment or DEFAULT_EXPERIMENT
    print(f"MLflow tracking URI: {uri} (experiment {experiment!r})", flush=True)
    run = tracking.MLflowRun(uri, experiment, name)
    tags = {**provenance(), names.ALGORITHM: args.algo, names.ENV: args.env, names.SEED: str(args.seed),
            **({names.RESTORED_FROM: str(Path(args.restore).resolve())} if args.restore else {})}
    if run.start(tags, {**config.to_dict(), "stop": stop.to_tune()}) is None:
        return None
    print(f"MLflow run: {run.run_id}", flush=True)
    return run
