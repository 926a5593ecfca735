"""A sweep's best setting, measured again on seeds that did not choose it.

The best setting of a paper sweep (lowest mean final regret, or highest mean final return, over
its settings) is picked by the same seeds' means that then describe it, so its value is biased
in its favour, the more so the more settings it beat. For each spec of the experiments given,
this script reads the sweep from the MLflow store ``bench/reproduce.sh`` filled, picks its best
setting, runs that setting alone on new seeds (a spec ``<name>_heldout`` in
``REPRO_DIR/heldout/``: the spec with the setting fixed and only the seed searched) into the
same store (its output in ``<name>_heldout.log`` there), and prints a Markdown table: the
selection's mean [95% CI] over its seeds beside the held-out seeds' (Student-t,
:func:`haepo_ray.report.stats.mean_ci`).

    python bench/held_out_best.py bandit_k10 bandit_k20 bandit_k30          # regret, seeds 5-9
    python bench/held_out_best.py cartpole_haepo --metric return --seeds 5 6 7 8 9 10 11 12 13 14

An argument is an experiment (its specs ``tune_configs/paper/<experiment>_*.yaml``) or one spec
(``tune_configs/paper/<spec>.yaml``). A spec with one setting (only seeds searched) selected
nothing: its held-out sweep is that setting on more seeds. A held-out sweep already in the
store is read, not run again.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from haepo_ray.report.aggregate import Group, group_trials  # noqa: E402
from haepo_ray.report.interval_cells import interval_text  # noqa: E402
from haepo_ray.report.runs import REGRET, RETURN, load_trials  # noqa: E402
from haepo_ray.report.stats import mean_ci  # noqa: E402

METRICS = {"regret": (REGRET, np.nanargmin), "return": (RETURN, np.nanargmax)}  # name -> (key, pick the best)
HELD_OUT = "_heldout"


def best_group(groups: list[Group], metric: str) -> Group:
    """The group (setting) with the best mean over its seeds of the final ``metric`` (:data:`METRICS`)."""
    key, pick = METRICS[metric]
    return groups[int(pick([float(np.nanmean(g.final(key))) for g in groups]))]


def held_out_spec(spec: dict, setting: dict, seeds: list[int]) -> dict:
    """``spec`` (a sweep spec's YAML data) named ``<name>_heldout``, with ``setting`` (search
    values by their spec names) fixed and only ``seeds`` searched, on a grid."""
    out = {**spec, "name": spec["name"] + HELD_OUT,
           "description": f"{spec['name']}'s best setting ({setting}) on held-out seeds {seeds}",
           "settings": {**spec.get("settings", {}), **setting},
           "search_space": {"seed": {"grid": list(seeds)}}, "search": {"algorithm": "grid"}}
    unknown = set(setting) - set(spec.get("search_space", {}))
    if unknown:
        raise ValueError(f"{spec['name']}: {sorted(unknown)} are not in its search_space")
    return out


def run_held_out(path: Path, uri: str, repro_dir: Path, metric: str, seeds: list[int], haepo: str) -> str:
    """One table row for the spec at ``path``; a SystemExit that says why where there is none."""
    spec = yaml.safe_load(path.read_text())
    try:
        groups = group_trials(load_trials(uri, [spec["name"]]))
    except LookupError:
        raise SystemExit(f"no sweep {spec['name']} in {uri}: run bench/reproduce.sh first") from None
    best = best_group(groups, metric)
    chosen_seeds = sorted(int(t.seed) for t in best.trials)
    if set(chosen_seeds) & set(seeds):
        raise SystemExit(f"{spec['name']}: seeds {sorted(set(chosen_seeds) & set(seeds))} picked the best setting: "
                         "they are not held out")
    held = held_out_spec(spec, best.config, seeds)
    try:
        trials = load_trials(uri, [held["name"]])
    except LookupError:  # not run yet
        held_path = repro_dir / "heldout" / f"{held['name']}.yaml"
        held_path.parent.mkdir(parents=True, exist_ok=True)
        held_path.write_text(yaml.safe_dump(held, sort_keys=False))
        print(f"running {held_path} (its output: {held_path.with_suffix('.log')})", file=sys.stderr, flush=True)
        with held_path.with_suffix(".log").open("w") as log:
            subprocess.run([haepo, "sweep", str(held_path), "--tracking-uri", uri, "--storage-path",
                            str(repro_dir / "ray_results"), "--quiet"], stdout=log, stderr=subprocess.STDOUT,
                           check=True)
        trials = load_trials(uri, [held["name"]])
    ran = sorted(int(t.seed) for t in trials)
    if ran != seeds:
        raise SystemExit(f"{held['name']} in {uri} ran seeds {ran}, not {seeds}: ask for those, or "
                         "delete that experiment to run it again")
    key = METRICS[metric][0]
    (again,) = group_trials(trials)
    setting = best.config_label if len(groups) > 1 else "(its one setting)"
    return (f"| {spec['name']} | {setting} | {len(groups)} "
            f"| {interval_text(mean_ci(best.final(key)), mark_t=False)} (seeds {chosen_seeds[0]}-{chosen_seeds[-1]}) "
            f"| {interval_text(mean_ci(again.final(key)), mark_t=False)} (seeds {seeds[0]}-{seeds[-1]}) |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment", nargs="+", help="e.g. bandit_k10 (its specs tune_configs/paper/"
                        "<experiment>_*.yaml) or cartpole_haepo (one spec)")
    parser.add_argument("--metric", choices=tuple(METRICS), default="regret", help="what picks the best setting: "
                        "the lowest mean final regret per step, or the highest mean final return")
    parser.add_argument("--seeds", type=int, nargs="+", default=[5, 6, 7, 8, 9], help="the held-out seeds")
    parser.add_argument("--repro-dir", type=Path, default=REPO / ".haepo" / "reproduction",
                        help="bench/reproduce.sh's REPRO_DIR: its mlflow.db is read and added to")
    parser.add_argument("--haepo", default=str(REPO / ".venv" / "bin" / "haepo"),
                        help="the haepo command that runs the held-out sweeps (default: %(default)s)")
    args = parser.parse_args(argv)
    uri = f"sqlite:///{args.repro_dir.resolve() / 'mlflow.db'}"
    rows = [f"| spec | best setting | settings compared | final {args.metric}, those seeds [95% CI] "
            f"| final {args.metric}, held-out seeds [95% CI] |", "|---|---|---|---|---|"]
    paper = REPO / "tune_configs" / "paper"
    for experiment in args.experiment:
        specs = [paper / f"{experiment}.yaml"] if (paper / f"{experiment}.yaml").is_file() else sorted(
            paper.glob(f"{experiment}_*.yaml"))
        if not specs:
            parser.error(f"no spec tune_configs/paper/{experiment}.yaml, nor specs {experiment}_*.yaml")
        rows += [run_held_out(path, uri, args.repro_dir, args.metric, sorted(args.seeds), args.haepo)
                 for path in specs]
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
