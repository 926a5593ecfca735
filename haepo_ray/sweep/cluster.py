"""What the Ray a sweep runs on offers its trials: :class:`Cluster` (CPUs, GPUs and their
memory), read once Ray is up, what it lacks for a request (:meth:`Cluster.lacks`), and
:func:`require_resources`, so that trials that ask for more than a local Ray has fail at start
instead of waiting for ever; and, before a sweep joins a running Ray, whether its head answers
at ``--address`` (:func:`head_problem`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from haepo_ray.sweep.spec import SpecError, SweepSpec
from haepo_ray.uris import is_http_url, unreachable

__all__ = ["HEAD_HINT", "Cluster", "head_problem", "require_resources"]

HEAD_TIMEOUT_S = 10.0  # for --address's TCP check: ray.init retries a head that does not answer for minutes
HEAD_HINT = ("check the address (the head's GCS port, 6379 by default) and that the head is up (--address auto on "
             "one of its nodes)")


@dataclass(frozen=True)
class Cluster:
    """GPUs of the Ray cluster and, when known, the smallest one's memory; its CPUs."""

    gpus: float | None  # None: not connected (``haepo sweep --dry-run``)
    gpu_memory_gib: float | None = None
    gpu_kind: str | None = None  # e.g. Ray's accelerator type A100-40G
    embedded: bool = True  # a local Ray this sweep started, which cannot grow
    cpus: float | None = None  # None: not read

    def lacks(self, asked: Mapping[str, float]) -> list[tuple[str, float, float]]:
        """(resource, asked, has) for GPU, then CPU, where ``asked`` (Ray resource -> amount)
        wants more than this Ray has, as far as it is known."""
        have = {"GPU": self.gpus, "CPU": self.cpus}
        return [(r, asked.get(r, 0.0), h) for r, h in have.items() if h is not None and asked.get(r, 0.0) > h]

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

        resources = ray.cluster_resources()
        gpus, cpus = resources.get("GPU", 0.0), resources.get("CPU", 0.0)
        kinds = sorted({key.split(":", 1)[1] for node in ray.nodes() if node.get("Alive")
                        for key in node.get("Resources", {}) if key.startswith("accelerator_type:")})
        known = [ACCELERATORS[RAY_ACCELERATOR_TYPES[k]].memory_gib for k in kinds if k in RAY_ACCELERATOR_TYPES]
        if gpus and known and len(known) == len(kinds):
            return cls(gpus, min(known), ",".join(kinds), embedded, cpus)
        if gpus:
            import torch

            if torch.cuda.is_available():
                props = torch.cuda.get_device_properties(0)
                return cls(gpus, props.total_memory / 2**30, props.name, embedded, cpus)
        return cls(gpus, None, ",".join(kinds) or None, embedded, cpus)


def require_resources(spec: SweepSpec, trial: Mapping[str, float], cluster: Cluster, *, gpus_from: str,
                      cpu_fix: str, cpus_from: str) -> None:
    """A SpecError when each trial asks for more CPUs or GPUs (``trial``: Ray resource ->
    amount) than a local Ray has: it cannot grow, so they would wait for ever (a remote
    cluster may add nodes: there they wait). ``gpus_from`` / ``cpus_from``: the settings that
    ask for them; ``cpu_fix``: what to set to train on CPUs."""
    if not cluster.embedded:
        return
    where = spec.source or "<spec>"
    for resource, asked, has in cluster.lacks(trial):
        if resource == "GPU":
            raise SpecError(f"{where}: each trial asks for {asked:g} GPU(s) ({gpus_from}), but the embedded local "
                            f"Ray has {f'{has:g}' if has else 'none'}: its trials would wait for ever. Run it on a "
                            f"Ray cluster with the GPUs (--address), or {cpu_fix} to train on CPUs")
        raise SpecError(f"{where}: each trial asks for {asked:g} CPUs ({cpus_from}), but the embedded local Ray "
                        f"has {has:g} (ray.num_cpus, else this machine's): its trials would wait for ever. Ask "
                        f"for fewer, give the embedded Ray more with ray.num_cpus, or run it on a Ray cluster "
                        f"(--address)")


def head_problem(address: str) -> str | None:
    """Why a sweep cannot join a running Ray at ``address``, in seconds, or None: a Ray
    Client's or a dashboard's address, not ``HOST:PORT``, or no Ray head answers there
    (``ray.init`` would retry it for minutes); ``auto`` is Ray's to find."""
    if address.startswith("ray://"):
        return (f"--address {address}: Ray Client addresses are not supported (the sweep's driver, which logs to "
                "MLflow, must run inside the cluster); submit it as a job instead: haepo submit SPEC --address "
                "http://HEAD:8265")
    if is_http_url(address):
        return (f"--address {address}: an HTTP address is a head's dashboard, where haepo submit sends jobs; haepo "
                "sweep joins a running Ray at its GCS address, HOST:6379 (--address auto on one of its nodes)")
    if address in ("auto", "local"):
        return None
    host, _, port = address.rpartition(":")
    if not (host and port.isdigit()):
        return f"--address {address}: expected HOST:PORT, the head's GCS address, or auto"
    reason = unreachable(host.strip("[]"), int(port), HEAD_TIMEOUT_S)  # [::1]:6379
    return f"--address {address}: no Ray head answers there ({reason}): {HEAD_HINT}" if reason else None
