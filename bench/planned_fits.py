"""The paper's TL;DR specs planned to fit GPUs of 40, 24 and 16 GiB, on the paper's two models.

For each of ``tune_configs/paper/tldr_{haepo,grpo,dpo}.yaml``, each model and each GPU memory,
the spec with ``llm.model`` and ``llm.gpu_memory_gb`` changed goes through ``haepo sweep
--dry-run``'s own code (``parse_plan`` then :func:`haepo_ray.sweep.dry_run.dry_run`): the
trials' plans as the dry run prints them (and, when planned, every combination the plan
simulated), or the refusal it raises. One process, so each
distinct memory configuration is simulated once (``estimate`` is cached).

    .venv/bin/python bench/planned_fits.py OUT.md [--models ...] [--gib 40 24 16]
"""

from __future__ import annotations

import argparse
import copy
import io
import sys
import time
from pathlib import Path

from haepo_ray.sweep.cluster import Cluster
from haepo_ray.sweep.dry_run import dry_run
from haepo_ray.sweep.kinds import parse_plan
from haepo_ray.sweep.spec import SpecError
from haepo_ray.sweep.spec_yaml import load_yaml

ROOT = Path(__file__).resolve().parents[1]
ALGOS = ("haepo", "grpo", "dpo")


def _one(spec: dict, model: str, gib: float) -> tuple[str, str]:
    """(outcome, the dry run's trial table or refusal) of ``spec`` on ``model`` held to ``gib``."""
    spec = copy.deepcopy(spec)
    spec["llm"] |= {"model": model, "gpu_memory_gb": gib}
    out = io.StringIO()
    try:
        plan = parse_plan(spec, f"{spec['name']}.yaml")
        dry_run(plan, out=out)
    except SpecError as err:
        return "refused", str(err)
    lines = out.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("trial"))
    trials = "\n".join(lines[start:start + 5])
    if " planned " not in trials:
        return "fits as given", trials
    fitted = plan.fitted(Cluster.unknown())  # the dry run's plan again, from the cached simulations
    considered = next(iter(fitted.fit.plans.values())).considered
    rows = [f"{c.micro_batch_size or 'whole'}  {'on' if c.gradient_checkpointing else 'off'}  "
            f"reserved {c.estimate.reserved_gib:.3g} GiB  hours {c.estimate.seconds / 3600:.3g}" for c in considered]
    return "planned", trials + "\n\nconsidered (micro_batch_size, checkpointing):\n" + "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--models", nargs="+", default=["qwen2.5-1.5b-instruct", "llama-3.2-1b-instruct"])
    parser.add_argument("--gib", nargs="+", type=float, default=[40, 24, 16])
    args = parser.parse_args(argv)
    sections = []
    for model in args.models:
        for algo in ALGOS:
            path = ROOT / "tune_configs" / "paper" / f"tldr_{algo}.yaml"
            spec = load_yaml(path.read_text(), str(path))
            for gib in args.gib:
                started = time.perf_counter()
                outcome, text = _one(spec, model, gib)
                seconds = time.perf_counter() - started
                sections.append(f"### {model}, {algo.upper()}, {gib:g} GiB: {outcome} ({seconds:.0f} s)\n\n"
                                f"```\n{text}\n```\n")
                print(sections[-1], flush=True)
                args.out.write_text("\n".join(sections))
    return 0


if __name__ == "__main__":
    sys.exit(main())
