"""The paper's *trend* claims, measured from the reproduction sweeps' MLflow store.

The paper claims, for the Gaussian bandit, that as K grows HAEPO "sustains exploration longer"
(its policy entropy curves rise) and that "fluctuations in HAEPO's per-step regret shrink",
both "as compared to PPO and DPO"; for the random walk, that "variance in HAEPO's return curve
decreases when moving from size 10 to size 20". This script prints, per algorithm and K (or n),
the numbers those claims are about, as Markdown tables:

    python bench/paper_trends.py bandit        # bandit_k{10,20,30}_{haepo,ppo,dpo}
    python bench/paper_trends.py random_walk   # random_walk_n{10,20}_{haepo,ppo,dpo}

Definitions (every trial of a sweep, i.e. all its settings and seeds, unless named "best"):

- entropy / log K: the policy entropy (nats) over log K, the uniform policy's, averaged over
  a trial's first half and over its last quarter of iterations; 1 = uniform, 0 = one arm.
- regret fluctuation: a trial's mean absolute change of the per-step regret from one
  iteration to the next over its second half (how jagged the curve is, not how high).
- seed spread: the standard deviation over seeds of the final regret, at each setting, then
  averaged over settings.
- band width (random walk): the standard deviation over seeds of the success rate at each
  update, averaged over the updates (the shaded band of the figure).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from held_out_best import best_group  # noqa: E402

from haepo_ray.report.aggregate import Group, group_trials  # noqa: E402
from haepo_ray.report.runs import ENTROPY, REGRET, SUCCESS, Trial, load_trials  # noqa: E402

ALGORITHMS = ("haepo", "ppo", "dpo")
DEFAULT_URI = f"sqlite:///{REPO / '.haepo' / 'reproduction' / 'mlflow.db'}"  # bench/reproduce.sh's


def _series(trial: Trial, metric: str) -> np.ndarray:
    if metric not in trial.curves:
        return np.array([])
    return trial.curves[metric].dropna().to_numpy(float)


def entropy_fraction(trials: list[Trial], k: int, part: slice) -> float:
    """Mean over trials of the policy entropy / log K over the iterations ``part`` selects
    (given as fractions of a trial's length)."""
    values = []
    for t in trials:
        h = _series(t, ENTROPY)
        if len(h):
            lo, hi = int(part.start * len(h)), max(int(part.stop * len(h)), int(part.start * len(h)) + 1)
            values.append(h[lo:hi].mean() / math.log(k))
    return float(np.mean(values)) if values else math.nan


def regret_fluctuation(trials: list[Trial]) -> float:
    """Mean over trials of |regret_i+1 - regret_i| over each trial's second half."""
    values = [np.abs(np.diff(r[len(r) // 2:])).mean() for t in trials if len(r := _series(t, REGRET)) > 3]
    return float(np.mean(values)) if values else math.nan


def final_mean(group: Group, metric: str) -> float:
    return float(np.nanmean(group.final(metric)))


def sweeps(uri: str, experiment: str, sizes: tuple[int, ...]):
    """(size, algorithm, trials or None when that sweep was not run) for the sweeps
    ``<experiment><size>_<algorithm>``."""
    for size in sizes:
        for algo in ALGORITHMS:
            try:
                yield size, algo, load_trials(uri, [f"{experiment}{size}_{algo}"])
            except LookupError:
                yield size, algo, None


def bandit(uri: str) -> str:
    rows = ["| K | algorithm | entropy / log K, first half | entropy / log K, last quarter "
            "| regret fluctuation | seed spread of final regret | final regret, mean of settings "
            "| final regret, best setting |",
            "|---|---|---|---|---|---|---|---|"]
    for k, algo, trials in sweeps(uri, "bandit_k", (10, 20, 30)):
        if trials is None:
            rows.append(f"| {k} | {algo} | not run |")
            continue
        groups = group_trials(trials)
        finals = [final_mean(g, REGRET) for g in groups]
        best = best_group(groups, "regret")  # the setting bench/held_out_best.py runs again
        spread = float(np.nanmean([np.nanstd(g.final(REGRET)) for g in groups]))
        rows.append(
            f"| {k} | {algo} | {entropy_fraction(trials, k, slice(0.0, 0.5)):.3f} "
            f"| {entropy_fraction(trials, k, slice(0.75, 1.0)):.3f} "
            f"| {regret_fluctuation(trials):.4f} | {spread:.4f} | {np.nanmean(finals):.4f} "
            f"| {final_mean(best, REGRET):.4f} ({best.config_label}) |")
    return "\n".join(rows)


def random_walk(uri: str) -> str:
    rows = ["| n | algorithm | band width (std over seeds of success, mean over updates) "
            "| first update with success >= 0.95, per seed | final success |",
            "|---|---|---|---|---|"]
    for n, algo, trials in sweeps(uri, "random_walk_n", (10, 20)):
        if trials is None:
            rows.append(f"| {n} | {algo} | not run |")
            continue
        (group,) = group_trials(trials)
        band = float(group.curve(SUCCESS)["std"].mean())
        first = []
        for t in sorted(trials, key=lambda t: int(t.seed)):
            success = _series(t, SUCCESS)
            hit = np.flatnonzero(success >= 0.95)
            first.append(str(int(t.curves[SUCCESS].dropna().index[hit[0]])) if len(hit) else "never")
        rows.append(f"| {n} | {algo} | {band:.3f} | {', '.join(first)} "
                    f"| {final_mean(group, SUCCESS):.2f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment", choices=("bandit", "random_walk"))
    parser.add_argument("--tracking-uri", default=DEFAULT_URI,
                        help="the MLflow store bench/reproduce.sh filled (default: %(default)s)")
    args = parser.parse_args(argv)
    print((bandit if args.experiment == "bandit" else random_walk)(args.tracking_uri))
    return 0


if __name__ == "__main__":
    sys.exit(main())
