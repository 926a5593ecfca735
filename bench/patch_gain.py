"""What each optional upstream patch gains: the same sweep with MLflow on, run as ``haepo sweep``
in a fresh process under each ``HAEPO_PATCHES`` setting, the settings taking turns. Results:
BENCHMARKS.md ("Upstream patches").

    python bench/patch_gain.py                    # 48 one-iteration bandit trials, 2 slots, 2 rounds
    python bench/patch_gain.py -n 96 --rounds 3

The sweep is ``bench/scale.py``'s (one-iteration HAEPO trials on the 10-armed bandit, actors
reused), tracked in a SQLite MLflow store of its own. Each setting leaves one optional patch out
(``all`` keeps every one, ``required`` none): its wall time against ``all``'s is that patch's
gain. CPU-seconds are the machine's (``/proc/stat``: every process, so run it on an idle
machine); the load is printed with each run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

from process_cpu import busy_seconds  # noqa: E402
from scale import spec_data  # noqa: E402

from haepo_ray.upstream.declared import OPTIONAL  # noqa: E402

SETTINGS = {"all": "all", **{f"without {key}": ",".join(k for k in OPTIONAL if k != key) for key in OPTIONAL},
            "required": "required"}


def run(spec: Path, setting: str, folder: Path) -> dict:
    env = {**os.environ, "HAEPO_PATCHES": setting, "RAY_USAGE_STATS_ENABLED": "0"}
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    load = os.getloadavg()[0]
    cpu, wall = busy_seconds(), time.perf_counter()
    subprocess.run([sys.executable, "-m", "haepo_ray.cli", "sweep", str(spec), "--tracking-uri", uri,
                    "--storage-path", str(folder / "ray"), "--experiment", "patch-gain"],
                   env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    return {"wall_s": time.perf_counter() - wall, "cpu_s": busy_seconds() - cpu, "load_before": load}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=48, help="trials (default 48)")
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--settings", nargs="*", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--out", default=str(REPO / ".haepo" / "bench" / "patch_gain.json"))
    args = parser.parse_args()

    runs: dict[str, list[dict]] = {name: [] for name in args.settings}
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.yaml"
        spec.write_text(yaml.safe_dump(spec_data(args.n, args.slots)))
        for r in range(args.rounds):
            for name in args.settings:
                folder = Path(tmp) / f"{r}-{name.replace(' ', '-')}"
                folder.mkdir()
                runs[name].append(run(spec, SETTINGS[name], folder))
                print(f"round {r + 1} {name:>20}: {runs[name][-1]['wall_s']:6.1f} s wall, "
                      f"{runs[name][-1]['cpu_s']:6.1f} CPU-s (load {runs[name][-1]['load_before']:.2f})", flush=True)
    base = statistics.median(x["wall_s"] for x in runs[args.settings[0]])
    print(f"\n{args.n} trials, {args.slots} slots, MLflow on; medians over {args.rounds} rounds")
    print("| HAEPO_PATCHES | wall s | CPU-s | wall vs " + args.settings[0] + " |\n|---|---|---|---|")
    for name, xs in runs.items():
        wall, cpu = statistics.median(x["wall_s"] for x in xs), statistics.median(x["cpu_s"] for x in xs)
        print(f"| {name} (`{SETTINGS[name]}`) | {wall:.1f} | {cpu:.1f} | {wall / base:.2f}x |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"n": args.n, "slots": args.slots, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
