"""What the Ray a sweep runs on offers its trials: :class:`Cluster` (GPUs and their memory),
read once Ray is up, and :func:`require_gpus`, so that trials that ask for GPUs a Ray does not
have fail at start instead of waiting for ever."""

from __future__ import annotations

from dataclasses import dataclass

from haepo_ray.sweep.spec import SpecError, SweepSpec

__all__ = ["Cluster", "require_gpus"]


@dataclass(frozen=True)
class Cluster:
    """GPUs of the Ray cluster and, when known, the smallest one's memory."""

    gpus: float | None  # None: not connected (``haepo sweep --dry-run``)
    gpu_memory_gib: float | None = None
    gpu_kind: str | None = None  # e.g. Ray's accelerator type A100-40G
    embedded: bool = True  # a local Ray this sweep started, which cannot grow

    @classmethod
    def unknown(cls) -> Cluster:
        return cls(gpus=None)

    @classmethod
    def of_ray(cls, embedded: bool) -> Cluster:
        """Read the running Ray: its GPUs, their accelerator types (Ray's ``accelerator_type:``
        resources, known in :data:`~haepo_ray.llm.capacity.accelerators.RAY_ACCELERATOR_TYPES`),
        else the memory of this machine's first GPU."""
        import ray

        from haepo_ray.llm.capacity.accelerators import ACCELERATORS, RAY_ACCELERATOR_TYPES

        gpus = ray.cluster_resources().get("GPU", 0.0)
        kinds = sorted({key.split(":", 1)[1] for node in ray.nodes() if node.get("Alive")
                        for key in node.get("Resources", {}) if key.startswith("accelerator_type:")})
        known = [ACCELERATORS[RAY_ACCELERATOR_TYPES[k]].memory_gib for k in kinds if k in RAY_ACCELERATOR_TYPES]
        if gpus and known and len(known) == len(kinds):
            return cls(gpus, min(known), ",".join(kinds), embedded)
        if gpus:
            import torch

            if torch.cuda.is_available():
                props = torch.cuda.get_device_properties(0)
                return cls(gpus, props.total_memory / 2**30, props.name, embedded)
        return cls(gpus, None, ",".join(kinds) or None, embedded)


def require_gpus(spec: SweepSpec, trial_gpus: float, cluster: Cluster, where: str, fix: str) -> None:
    """A SpecError when trials ask for GPUs that a local Ray does not have (it cannot grow; a
    remote cluster may add GPU nodes, so there the trials wait). ``where``: the settings that
    ask for them; ``fix``: what to set to train on CPUs."""
    if trial_gpus <= 0 or cluster.gpus is None or cluster.gpus > 0 or not cluster.embedded:
        return
    raise SpecError(f"{spec.source or '<spec>'}: each trial asks for {trial_gpus:g} GPU(s) ({where}), but the "
                    f"embedded local Ray has none: its trials would wait for ever. Run it on a Ray cluster "
                    f"with GPUs (--address), or {fix} to train on CPUs")
