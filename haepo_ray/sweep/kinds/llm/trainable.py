"""The Tune trainable of a language-model sweep: a Ray Train ``TorchTrainer`` per trial, or
the trial's own process.

*Why a function that builds a trainer.* Ray 2.60 runs Ray Train V2, where handing a
``TorchTrainer`` to a ``Tuner`` is deprecated; a Tune trial is a function (:func:`llm_trial`,
the trial's *driver*) that builds the trainer and fits it, and Train's
``TuneReportCallback`` forwards rank 0's reports to Tune. The driver only waits: it asks Tune
for the spec's ``resources``, the workers ask Ray Train for theirs (``llm`` in the spec), so
Tune does not count them (language-model sweeps run one trial at a time unless the spec's
``max_concurrent_trials`` says otherwise).

*Why also without Ray Train.* With ``llm.num_workers: 0`` the trial's process runs the same
loop itself, as RLlib's ``num_learners=0`` does: a one-worker ``TorchTrainer`` starts about
seven actor processes (controller, workers, queue, synchronisation, ...), 20-30 s per trial on
2 CPU cores, more than a small model's few updates; a finished trial's process is reused by the
next (``reuse_actors``), imports and all. Tune then keeps the checkpoints. The trial gives its
memory back when it ends (:func:`~haepo_ray.sweep.trial_process.release_memory`): glibc keeps
what a trial freed, and a reused process grew by about 1.1 GB per SmolLM2 trial until Ray's
memory monitor killed it.

*Workers.* :func:`worker_loop` runs :class:`~haepo_ray.llm.train.LLMRun` on each worker with
the process group Ray Train set up (gloo on CPU, NCCL on GPU): whole prompt groups per worker,
gradients summed, so W workers train what one does (:mod:`haepo_ray.llm.distributed`). One
Tune result per RL update: the metric row flattened with ``/`` (its ``train_time_s`` is rank
0's run's wall time from loading on; Tune's ``time_total_s`` also holds the start of the
workers) and rank 0's provenance (:mod:`haepo_ray.provenance`), its SFT start and the device its policy is on,
beside the GPUs Ray gave its process (run tags).

*SFT starts.* A trial begins RL from the SFT start of its key
(:mod:`haepo_ray.llm.sft_start`) in ``<experiment folder>/sft_starts``: the first trial that
needs it makes it, every other one (any algorithm, the same seed) loads it, and the run's
MLflow tag ``haepo.sft_start`` is its key. On storage that is not a mounted filesystem (S3,
GCS) there is no lock, and each trial runs its own SFT.

*Checkpoints and restarts.* Rank 0 checkpoints every ``checkpoint_frequency`` updates (the
model, the reference, the optimiser, the output files) and at the end (the policy and the
output files: ``generations.jsonl`` is logged to MLflow from it). Train keeps them in the
trial's folder (``<trial>/train``); a trial that Tune restarts (``max_failures``, or a sweep
resumed with ``--resume``) builds the same trainer, which restores the newest one, and goes
on from that update. Tune's ``training_iteration`` starts again in a restarted trial; the
update (``names.LLM_UPDATE``) does not, so it is the step of everything downstream. A worker
writes its run's files and each checkpoint first in a folder of its node's temporary directory
(:func:`~haepo_ray.sweep.trial_scratch.scratch_folder`), which the next trial on the node
removes if the worker was killed.
"""

from __future__ import annotations

import functools
import os
import tempfile
from types import ModuleType
from typing import Any

from haepo_ray import names
from haepo_ray.sweep.kinds.llm.fit import check_own_fit
from haepo_ray.sweep.kinds.llm.config import RAY_TRAIN, trial_settings
from haepo_ray.sweep.trial_process import release_memory
from haepo_ray.sweep.trial_scratch import scratch_folder

SFT_STARTS = "sft_starts"  # in the experiment's folder: the sweep's SFT starts (haepo_ray.llm.sft_start)
SCRATCH_PREFIX = "haepo-llm-"  # a worker's run files and checkpoints before Ray copies them (trial_scratch)


def llm_trial(config: dict[str, Any]) -> None:
    """One trial: :func:`worker_loop` here (no workers) or in a ``TorchTrainer`` of
    ``config[RAY_TRAIN]``'s workers."""
    import ray.train
    from ray import tune

    workers = config[RAY_TRAIN]
    config = check_own_fit(config, workers["num_workers"])
    storage = tune.get_context().get_storage()
    starts = sft_starts(storage)
    if workers["num_workers"] == 0:
        try:
            worker_loop(config, session=tune, starts=starts)
        finally:
            release_memory()
        return
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    trainer = TorchTrainer(
        functools.partial(worker_loop, starts=starts),
        train_loop_config=config,
        scaling_config=ray.train.ScalingConfig(num_workers=workers["num_workers"], use_gpu=workers["use_gpu"],
                                               resources_per_worker=dict(workers["resources_per_worker"])),
        run_config=ray.train.RunConfig(
            name="train",  # inside the trial's folder: a restarted trial finds its checkpoints here
            storage_path=storage.trial_fs_path,
            storage_filesystem=storage.storage_filesystem,
            callbacks=[TuneReportCallback()],
            failure_config=ray.train.FailureConfig(max_failures=0),  # Tune's max_failures retries
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=workers["keep_checkpoints"]),
        ),
    )
    trainer.fit()


def sft_starts(storage: Any) -> str | None:
    """The SFT starts' folder of a trial's Tune ``StorageContext``: ``<experiment
    folder>/sft_starts`` on a local or mounted filesystem, else ``None``."""
    import pyarrow.fs

    if not isinstance(storage.storage_filesystem, pyarrow.fs.LocalFileSystem):
        return None
    return os.path.join(storage.experiment_fs_path, SFT_STARTS)


def worker_loop(config: dict[str, Any], session: ModuleType | None = None, starts: str | None = None) -> None:
    """One worker: the SFT start (:func:`~haepo_ray.llm.sft_start.begin_rl` in the folder
    ``starts``) or the newest checkpoint, then one report per RL update.

    ``session``: the module whose ``get_checkpoint``, ``report`` and ``Checkpoint`` it uses,
    ``ray.train`` (a Ray Train worker, the default) or ``ray.tune`` (the trial's process)."""
    import ray.train

    from haepo_ray.llm.distributed import World
    from haepo_ray.llm.run_log import rl_metrics
    from haepo_ray.llm.sft_start import begin_rl, start_key
    from haepo_ray.llm.train import LLMRun
    from haepo_ray.provenance import device_tags, provenance
    from haepo_ray.tracking.schema import flatten

    session = session or ray.train
    workers = config[RAY_TRAIN]
    if not workers["use_gpu"]:
        device = "cpu"
    elif session is ray.train:
        import ray.train.torch

        device = str(ray.train.torch.get_device())
    else:
        device = "cuda"  # Tune gave the trial's process its GPU (CUDA_VISIBLE_DEVICES)
    settings = trial_settings(config, device)
    every = workers["checkpoint_frequency"]
    with scratch_folder(SCRATCH_PREFIX) as scratch:
        run = LLMRun(settings, scratch / "run", world=World.current())
        tags = {names.SFT_START: start_key(settings),
                **device_tags(policy=[next(run.model.parameters()).device])}
        try:
            checkpoint = session.get_checkpoint()
            if checkpoint is not None:
                with checkpoint.as_directory() as folder:
                    run.restore(folder)
            else:
                begin_rl(run, starts)
            for row in run.rl():
                final = run.update == settings.rl_updates
                metrics = {**flatten(rl_metrics(row)), names.PROVENANCE: provenance(), names.RUN_TAGS: tags}
                with tempfile.TemporaryDirectory(prefix="checkpoint-", dir=scratch) as folder:
                    saved = None
                    if run.world.is_main and (final or (every and run.update % every == 0)):
                        run.save(folder, final=final)
                        saved = session.Checkpoint.from_directory(folder)
                    session.report(metrics, checkpoint=saved)
        finally:
            run.close()
