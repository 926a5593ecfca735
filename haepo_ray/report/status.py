"""Which trials a report aggregates: those whose MLflow run finished, one per seed.

A failed trial (its retries spent), a killed one (its sweep stopped) and one still running
(or whose driver died without ``--resume``) stopped short of its stop criterion: its last
value is not a final value and its seeds are not the configuration's. They are listed apart
(:func:`unfinished_table`) and left out of the means, the ``seeds`` column and the figures,
unless the report is asked to include them (``--include-unfinished``).

A sweep run again into its experiment (the same spec, or one that adds seeds) repeats the
seeds of the earlier one: a seed counted twice is not a second sample, and would narrow every
interval over seeds. Of the trials of one configuration with one seed the newest is
aggregated; the others are listed apart as repeats (:func:`newest_per_seed`).
"""

from __future__ import annotations

from collections import Counter

import pandas as pd

from haepo_ray.report.runs import Trial, config_label

UNSEEDED = (None, "None")  # a trial's seed when its sweep set none: each such trial is a sample of its own

ERROR_CHARS = 160  # of the error's last line, in the listing


def aggregated(trials: list[Trial], include_unfinished: bool) -> list[Trial]:
    """The trials that make the report's aggregates.

    Raises ``LookupError`` when none finished and unfinished ones are not included.
    """
    chosen = trials if include_unfinished else [t for t in trials if t.finished]
    if trials and not chosen:
        counts = Counter(t.status for t in trials)
        statuses = ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda c: (-c[1], c[0])))
        raise LookupError(f"no trial of these sweeps finished ({statuses}); --include-unfinished "
                          "reports them as they stand")
    return chosen


def unfinished_table(trials: list[Trial]) -> pd.DataFrame:
    """One row per trial whose run did not finish: what it was, its status, the last step it
    logged and the last line of its error."""
    rows = []
    for t in trials:
        if t.finished:
            continue
        last = int(t.curves.index.max()) if len(t.curves.index) else 0
        lines = [line for line in t.error.strip().splitlines() if line.strip()]
        rows.append({"experiment": t.experiment, "algorithm": t.algorithm, **t.subject,
                     "config": config_label(t.config), "seed": t.seed, "status": t.status,
                     "last step": last, "error": lines[-1][:ERROR_CHARS] if lines else "",
                     "run": t.run_id})
    return pd.DataFrame(rows)


def newest_per_seed(trials: list[Trial]) -> tuple[list[Trial], list[Trial]]:
    """(kept, repeats) of ``trials``, in :func:`~haepo_ray.report.runs.load_trials`'s order
    (an experiment's latest start first): the first trial of each configuration
    (:attr:`Trial.group`) and seed is kept, a later one is a repeat; an unseeded trial is
    always kept."""
    kept, repeats, seen = [], [], set()
    for trial in trials:
        key = (trial.group, str(trial.seed))
        if trial.seed in UNSEEDED or key not in seen:
            seen.add(key)
            kept.append(trial)
        else:
            repeats.append(trial)
    return kept, repeats


def repeats_table(repeats: list[Trial]) -> pd.DataFrame:
    """One row per repeat (:func:`newest_per_seed`): what it was, its seed, status and sweep."""
    return pd.DataFrame([{"experiment": t.experiment, "algorithm": t.algorithm, **t.subject,
                          "config": config_label(t.config), "seed": t.seed, "status": t.status,
                          "sweep": t.sweep, "run": t.run_id} for t in repeats])
