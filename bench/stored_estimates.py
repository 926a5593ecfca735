"""What the simulations kept on disk (haepo_ray/llm/capacity/stored.py) save: ``haepo sweep SPEC
--dry-run`` run twice in a row, each in a fresh process, the first on an empty ``$HAEPO_CACHE``
(every configuration simulated), the second on what the first stored; wall time and CPU-seconds
of each, and their ratio.

    python bench/stored_estimates.py [SPEC] [--json OUT.json]

SPEC defaults to the GPU sweep check's language-model sweep (``bench/gpu_sweep_check.py``:
HAEPO, GRPO and DPO x 2 seeds on ``random:qwen2.5-0.5b`` in bfloat16, ``gpus_per_worker: auto``
against an H200's 139.8 GiB), written to a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _check_spec(folder: Path) -> Path:
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_sweep_check

    check = gpu_sweep_check.Check("cpu", folder / "work", "aclsum")
    spec = gpu_sweep_check._lm_spec(check, "auto")
    spec["llm"] |= {"model": gpu_sweep_check.LM_MODEL["cuda"], "gpu_memory_gb": 139.8}
    spec["settings"] |= {"dtype": "bfloat16"}
    path = folder / "lm_packed.yaml"
    path.write_text(yaml.safe_dump({"name": "lm_packed", **spec}, sort_keys=False))
    return path


def _dry_run(spec: Path, cache: Path, cwd: Path) -> dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "haepo_ray.cli", "sweep", str(spec), "--dry-run"], cwd=cwd, check=True,
                   env={**os.environ, "HAEPO_CACHE": str(cache)}, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"wall_s": round(time.perf_counter() - start, 2),
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="stored-estimates-") as tmp:
        folder = Path(tmp)
        spec = (args.spec or _check_spec(folder)).resolve()
        cache = folder / "cache"
        empty, stored = _dry_run(spec, cache, folder), _dry_run(spec, cache, folder)
        files = len(list((cache / "estimates").glob("*.json")))
    result = {"spec": str(args.spec or "the GPU sweep check's LM sweep"), "empty_cache": empty,
              "stored": stored, "stored_files": files, "wall_ratio": round(empty["wall_s"] / stored["wall_s"], 2)}
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
