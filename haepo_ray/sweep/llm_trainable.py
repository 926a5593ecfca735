"""The Tune trainable of a language-model sweep: each trial is a Ray Train ``TorchTrainer``.

*Why a function that builds a trainer.* Ray 2.60 runs Ray Train V2, where handing a
``TorchTrainer`` to a ``Tuner`` is deprecated; a Tune trial is a function (:func:`llm_trial`,
the trial's *driver*) that builds the trainer and fits it, and Train's
``TuneReportCallback`` forwards rank 0's reports to Tune. The driver only waits: it asks Tune
for the spec's ``resources``, the workers ask Ray Train for theirs (``llm`` in the spec), so
Tune does not count them (language-model sweeps run one trial at a time unless the spec's
``max_concurrent_trials`` says otherwise).

*Workers.* :func:`worker_loop` runs :class:`~haepo_ray.llm.train.LLMRun` on each worker with
the process group Ray Train set up (gloo on CPU, NCCL on GPU): whole prompt groups per worker,
gradients summed, so W workers train what one does (:mod:`haepo_ray.llm.distributed`). One
Tune result per RL update: the metric row flattened with ``/`` and ``train_time_s``.

*Checkpoints and restarts.* Rank 0 checkpoints every ``checkpoint_frequency`` updates (the
model, the reference, the optimiser, the output files) and at the end (the policy and the
output files: ``generations.jsonl`` is logged to MLflow from it). Train keeps them in the
trial's folder (``<trial>/train``); a trial that Tune restarts (``max_failures``, or a sweep
resumed with ``--resume``) builds the same trainer, which restores the newest one, and goes
on from that update. Tune's ``training_iteration`` starts again in a restarted trial; the
update (``names.LLM_UPDATE``) does not, so it is the step of everything downstream.
"""

from __future__ import annotations

import tempfile
from typing import Any

from haepo_ray import names
from haepo_ray.sweep.llm_plan import RAY_TRAIN


def llm_trial(config: dict[str, Any]) -> None:
    """One trial: a ``TorchTrainer`` of :func:`worker_loop` on ``config[RAY_TRAIN]``'s workers."""
    import ray.train
    from ray import tune
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    workers = config[RAY_TRAIN]
    storage = tune.get_context().get_storage()
    trainer = TorchTrainer(
        worker_loop,
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


def worker_loop(config: dict[str, Any]) -> None:
    """One Ray Train worker: SFT (or the newest checkpoint), then one report per RL update."""
    import ray.train
    import ray.train.torch

    from haepo_ray.llm.distributed import World
    from haepo_ray.llm.train import LLMRun, LLMTrainSettings
    from haepo_ray.tracking.schema import flatten

    workers = config[RAY_TRAIN]
    device = str(ray.train.torch.get_device()) if workers["use_gpu"] else "cpu"
    settings = LLMTrainSettings(**{k: v for k, v in config.items() if k != RAY_TRAIN} | {"device": device})
    every = workers["checkpoint_frequency"]
    with tempfile.TemporaryDirectory(prefix="haepo-llm-") as out:
        run = LLMRun(settings, out, world=World.current())
        try:
            checkpoint = ray.train.get_checkpoint()
            if checkpoint is not None:
                with checkpoint.as_directory() as folder:
                    run.restore(folder)
            else:
                run.sft()
            for row in run.rl():
                final = run.update == settings.rl_updates
                metrics = {**flatten(row), names.LLM_TRAIN_TIME: sum(r["time_s"] for r in run.rows)}
                metrics.pop("phase")
                with tempfile.TemporaryDirectory(prefix="haepo-llm-checkpoint-") as folder:
                    saved = None
                    if run.world.is_main and (final or (every and run.update % every == 0)):
                        run.save(folder, final=final)
                        saved = ray.train.Checkpoint.from_directory(folder)
                    ray.train.report(metrics, checkpoint=saved)
        finally:
            run.close()
