"""REPRODUCTION.md's figures, read back from the MLflow store that ``bench/reproduce.sh`` filled.

Prints Markdown: per experiment, where its runs came from (the provenance tags the sweeps
wrote: commit, machine, library versions; the runs' first start and last end in UTC; how many
finished), then the numbers the page quotes for the chain MDP, the newsvendor and CartPole,
and every spec's seconds per 100 updates next to its wall time and load from ``times.tsv``.
The bandit and random-walk trend numbers are ``bench/paper_trends.py``'s.

    python bench/reproduction_figures.py --repro-dir .haepo/reproduction   # bench/reproduce.sh's REPRO_DIR
    python bench/reproduction_figures.py --repro-dir A --repro-dir B       # experiments split over two

A spec found in several stores is read from the last one given.

Definitions:

- first update with return >= 1 (chain MDP): the first training iteration whose mean return
  over its episodes is 1 (every episode reached the end of the chain);
- random walk, per seed: the first update with success rate >= 0.95 (the initial policy can
  score that by luck in update 1, hence:) the first update that starts 10 updates in a row
  at >= 0.95 ("held"), the updates after the first that fall below 0.95, the final success;
- window means (newsvendor): the mean over seeds and over the iterations of a window of the
  mean profit of each iteration's episodes;
- mean [95% CI] (chain MDP, newsvendor): the mean over seeds and its Student-t interval over
  the seeds' values (``haepo_ray.report.stats.mean_ci``, as ``haepo report``'s rl_results);
- solved (CartPole): the mean return of the last 100 episodes >= 475, recombined from the
  iterations' means and episode counts as ``bench/cartpole_vs_ppo.py`` does; time to solve is
  the trial's ``time_total_s`` at the end of the first iteration that meets it. A spec's
  held-out sweep (``<spec>_heldout``, ``bench/held_out_best.py``: more seeds) is a row of its
  own, and the fraction of all its seeds that solved gets a 95% Wilson score interval
  (:func:`wilson_ci`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import sys
from pathlib import Path
from statistics import NormalDist

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from cartpole_vs_ppo import last_episodes_mean  # noqa: E402
from held_out_best import HELD_OUT  # noqa: E402

from haepo_ray import names  # noqa: E402
from haepo_ray.report.aggregate import group_trials  # noqa: E402
from haepo_ray.report.provenance import COLUMNS, _distinct  # noqa: E402
from haepo_ray.report.runs import RETURN, SECONDS, SUCCESS, Trial, load_trials  # noqa: E402
from haepo_ray.report.stats import CONFIDENCE, mean_ci  # noqa: E402

EXPERIMENTS = {
    "chain_mdp": ("haepo",),
    "newsvendor": ("haepo",),
    "random_walk_n10": ("haepo", "ppo", "dpo"),
    "random_walk_n20": ("haepo", "ppo", "dpo"),
    "cartpole": ("haepo", "haepo_noreg", "ppo", "ppo_tuned"),
    "bandit_k10": ("haepo", "ppo", "dpo"),
    "bandit_k20": ("haepo", "ppo", "dpo"),
    "bandit_k30": ("haepo", "ppo", "dpo"),
}


def _utc(ms: int | None) -> str:
    if not ms:
        return "?"
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%d %H:%M")


def load(uri: str, out: dict[str, list[Trial]], uris: dict[str, str]) -> None:
    """Adds the sweeps of ``EXPERIMENTS`` found at ``uri``, and their held-out sweeps
    (``<name>_heldout``), to ``out`` (and their store to ``uris``)."""
    for experiment, algos in EXPERIMENTS.items():
        for algo in algos:
            for name in (f"{experiment}_{algo}", f"{experiment}_{algo}{HELD_OUT}"):
                try:
                    out[name] = load_trials(uri, [name])
                    uris[name] = uri
                except LookupError:
                    pass


def provenance(uris: dict[str, str], sweeps: dict[str, list[Trial]], times: dict[str, list[str]]) -> str:
    from mlflow.tracking import MlflowClient

    rows = ["| spec | runs (finished) | code | machine | ray / torch | runs' UTC start - end | spec wall (s) "
            "| load at its start / end |", "|---|---|---|---|---|---|---|---|"]
    for name, trials in sweeps.items():
        client = MlflowClient(tracking_uri=uris[name])
        infos = [client.get_run(t.run_id).info for t in trials]
        start = min(i.start_time for i in infos if i.start_time)
        end = max((i.end_time or 0) for i in infos)
        wall = times.get(name)
        rows.append(
            f"| {name} | {len(trials)} ({sum(t.finished for t in trials)}) | {_distinct(trials, COLUMNS['code'])} "
            f"| {_distinct(trials, COLUMNS['machine'])} | {_distinct(trials, COLUMNS['ray'])} / "
            f"{_distinct(trials, COLUMNS['torch'])} | {_utc(start)} - {_utc(end)[-5:]} "
            f"| {wall[2] if wall else '?'} | {f'{wall[4]} / {wall[5]}' if wall and len(wall) > 5 else '?'} |")
    return "\n".join(rows)


def wilson_ci(successes: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The Wilson score interval of a proportion, ``successes`` of ``n`` (two-sided
    ``confidence``): unlike the normal one, inside [0, 1] and not empty at 0 or n."""
    z = NormalDist().inv_cdf((1 + confidence) / 2)
    p, scale = successes / n, 1 + z * z / n
    centre = (p + z * z / (2 * n)) / scale
    half = z / scale * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def _ci(values: list[float]) -> str:
    """``0.78 [0.24, 1.32]``: the mean over seeds and its 95% Student-t interval, to 2 decimals."""
    ci = mean_ci(values)
    return f"{ci.mean:.2f} [{ci.low:.2f}, {ci.high:.2f}]"


def _series(trial: Trial, metric: str):
    return trial.curves[metric].dropna() if metric in trial.curves else None


def chain_mdp(trials: list[Trial]) -> str:
    rows = ["| normalisation | final return per seed | mean [95% CI] | first update with return 1, per seed |",
            "|---|---|---|---|"]
    for g in group_trials(trials):
        ts = sorted(g.trials, key=lambda t: int(t.seed))
        finals = [float(_series(t, RETURN).iloc[-1]) for t in ts]
        first = []
        for t in ts:
            r = _series(t, RETURN)
            hit = r[r >= 1.0 - 1e-9]
            first.append(str(int(hit.index[0])) if len(hit) else "never")
        rows.append(f"| {g.config_label} | {', '.join(f'{x:.2f}' for x in finals)} "
                    f"| {_ci(finals)} | {', '.join(first)} |")
    return "\n".join(rows)


def random_walk(sweeps: dict[str, list[Trial]], held: int = 10) -> str:
    """Per seed, in seed order (definitions in the module's docstring)."""
    rows = ["| spec | first update >= 0.95 | first of 10 in a row >= 0.95 | updates < 0.95 after the first "
            "| final success |", "|---|---|---|---|---|"]
    for name, trials in sweeps.items():
        if not name.startswith("random_walk"):
            continue
        first, run, below, final = [], [], [], []
        for t in sorted(trials, key=lambda t: int(t.seed)):
            s = _series(t, SUCCESS)
            ok = (s >= 0.95).to_numpy()
            hit = np.flatnonzero(ok)
            first.append(str(int(s.index[hit[0]])) if len(hit) else "never")
            starts = [i for i in range(len(ok) - held + 1) if ok[i:i + held].all()]
            run.append(str(int(s.index[starts[0]])) if starts else "never")
            below.append(str(int((~ok[hit[0]:]).sum())) if len(hit) else "-")
            final.append(f"{s.iloc[-1]:.2f}")
        rows.append(f"| {name} | {', '.join(first)} | {', '.join(run)} | {', '.join(below)} | {', '.join(final)} |")
    return "\n".join(rows)


WINDOWS = ((1, 20), (41, 60), (181, 200))


def newsvendor(trials: list[Trial]) -> str:
    head = " | ".join(f"updates {a}-{b}" for a, b in WINDOWS)
    rows = [f"| normalisation | {head} | final return |",
            "|---|" + "---|" * (len(WINDOWS) + 1)]
    for g in group_trials(trials):
        cells = []
        for a, b in WINDOWS:
            values = [float(_series(t, RETURN).loc[a:b].mean()) for t in g.trials]
            cells.append(_ci(values))
        finals = [float(_series(t, RETURN).iloc[-1]) for t in g.trials]
        rows.append(f"| {g.config_label} | {' | '.join(cells)} | {_ci(finals)} |")
    return "\n".join(rows)


def cartpole(uris: dict[str, str], sweeps: dict[str, list[Trial]], target: float = 475.0, window: int = 100) -> str:
    rows = ["| spec | seeds | seeds solved | time to solve (s), per seed | env steps to solve, per seed "
            "| updates | last-100-episode mean at the end, per seed |", "|---|---|---|---|---|---|---|"]
    ends_of: dict[str, list[float | None]] = {}  # spec -> each seed's end (None: no episode), sweep and held-out
    solved_of: dict[str, int] = {}
    for name in ("cartpole_haepo", "cartpole_haepo_noreg", "cartpole_ppo", "cartpole_ppo_tuned"):
        if name not in sweeps:
            rows.append(f"| {name} | not run |")
        for sweep in (name, name + HELD_OUT):
            if sweep in sweeps:
                row, solved, ends = _cartpole_row(sweep, sweeps[sweep], uris[sweep], target, window)
                rows.append(row)
                solved_of[name] = solved_of.get(name, 0) + solved
                ends_of.setdefault(name, []).extend(ends)
    totals = ["| spec | seeds solved, all its seeds | fraction [95% Wilson interval] "
              "| last-100-episode mean at the end, all its seeds [95% CI] |", "|---|---|---|---|"]
    for name, ends in ends_of.items():
        solved, n = solved_of[name], len(ends)
        low, high = wilson_ci(solved, n)
        last = mean_ci([np.nan if e is None else e for e in ends])
        totals.append(f"| {name} | {solved} / {n} | {solved / n:.2f} [{low:.2f}, {high:.2f}] "
                      f"| {last.mean:.0f} [{last.low:.0f}, {last.high:.0f}] |")
    return "\n".join(rows) + "\n\n" + "\n".join(totals)


def _cartpole_row(sweep: str, trials: list[Trial], uri: str, target: float,
                  window: int) -> tuple[str, int, list[float | None]]:
    """The table row of one CartPole sweep, how many of its seeds solved, and each seed's
    last-``window``-episode mean at the end (None: no episode)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    trials = sorted(trials, key=lambda t: int(t.seed))
    times, steps, updates, lasts = [], [], [], []
    for t in trials:
        episodes = {m.step: m.value for m in client.get_metric_history(t.run_id, names.EPISODES)}
        returns, seconds = _series(t, RETURN), _series(t, SECONDS)
        env_steps = _series(t, names.ENV_STEPS)
        iters, solved, last = [], None, None
        for step in sorted(episodes):
            value = returns.get(step) if returns is not None else None
            iters.append({"episodes": int(episodes[step]),
                          "return_mean": None if value is None or value != value else float(value)})
            last = last_episodes_mean(iters, window)
            if solved is None and last is not None and last >= target:
                solved = step
        times.append(f"{seconds[solved]:.0f}" if solved is not None else "-")
        steps.append(f"{int(env_steps[solved]):,}" if solved is not None else "-")
        lasts.append(last)
        updates.append(int(max(episodes)) if episodes else 0)
    n_solved = sum(x != "-" for x in times)
    seeds = f"{trials[0].seed}-{trials[-1].seed}"
    ends = ", ".join(f"{last:.0f}" if last is not None else "-" for last in lasts)
    return (f"| {sweep} | {seeds} | {n_solved} / {len(times)} | {', '.join(times)} | {', '.join(steps)} "
            f"| {min(updates)}-{max(updates)} | {ends} |", n_solved, lasts)


def per_100_updates(sweeps: dict[str, list[Trial]]) -> str:
    rows = ["| spec | seconds per 100 updates, mean over trials (min - max) |", "|---|---|"]
    for name, trials in sweeps.items():
        values = np.concatenate([g.seconds_per_100_updates() for g in group_trials(trials)])
        rows.append(f"| {name} | {np.nanmean(values):.1f} ({np.nanmin(values):.1f} - {np.nanmax(values):.1f}) |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repro-dir", action="append",
                        help="bench/reproduce.sh's REPRO_DIR (mlflow.db, times.tsv); repeatable "
                             "(default: .haepo/reproduction)")
    args = parser.parse_args(argv)
    times: dict[str, list[str]] = {}
    sweeps: dict[str, list[Trial]] = {}
    uris: dict[str, str] = {}
    for directory in args.repro_dir or [str(REPO / ".haepo" / "reproduction")]:
        repro = Path(directory).resolve()
        if (repro / "times.tsv").is_file():
            for line in (repro / "times.tsv").read_text().splitlines():
                cells = line.split("\t")
                times[cells[0]] = cells  # the last run of a spec
        load(f"sqlite:///{repro / 'mlflow.db'}", sweeps, uris)
    parts = ["## Provenance", provenance(uris, sweeps, times)]
    if "chain_mdp_haepo" in sweeps:
        parts += ["## Chain MDP", chain_mdp(sweeps["chain_mdp_haepo"])]
    if "newsvendor_haepo" in sweeps:
        parts += ["## Newsvendor", newsvendor(sweeps["newsvendor_haepo"])]
    if any(k.startswith("random_walk") for k in sweeps):
        parts += ["## Random walk", random_walk(sweeps)]
    if any(k.startswith("cartpole") for k in sweeps):
        parts += ["## CartPole", cartpole(uris, sweeps)]
    parts += ["## Seconds per 100 updates", per_100_updates(sweeps)]
    print("\n\n".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
