"""Which code, machine and libraries made a report's trials (the tags that
:mod:`haepo_ray.provenance` writes), per configuration, and three checks on them: an experiment
whose runs mix code versions is flagged, so is a configuration whose seeds ran with different
settings (sweeps of different specs in one experiment), and a report can require one commit for
every run (``bench/reproduce.sh`` requires its checkout's).

Runs logged before these tags existed show ``unknown``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping

import pandas as pd

from haepo_ray import names
from haepo_ray.provenance import changed_files, changed_paths
from haepo_ray.report.aggregate import Group
from haepo_ray.report.runs import Trial

UNKNOWN = "unknown"


class ProvenanceError(ValueError):
    """Runs of the report were made by another code version than the one required."""


def code_label(tags: Mapping[str, str]) -> str:
    """``1a2b3c4d5e6f`` (a commit), ``1a2b3c4d5e6f+dirty`` (uncommitted changes), ``haepo-ray
    0.1.0`` (an install outside git), or ``unknown``."""
    commit = tags.get(names.CODE_COMMIT)
    if commit:
        return commit[:12] + ("+dirty" if tags.get(names.CODE_DIRTY) == "true" else "")
    version = tags.get(names.CODE_VERSION)
    return f"haepo-ray {version}" if version else UNKNOWN


def machine_label(tags: Mapping[str, str]) -> str:
    """``2 CPUs (AMD EPYC), 23.5 GiB, GPUs: 0``, or ``unknown``."""
    if names.MACHINE_CPUS not in tags:
        return UNKNOWN
    model = f" ({tags[names.MACHINE_CPU]})" if tags.get(names.MACHINE_CPU) else ""
    return (f"{tags[names.MACHINE_CPUS]} CPUs{model}, {tags.get(names.MACHINE_MEMORY_GB, '?')} GiB, "
            f"GPUs: {tags.get(names.MACHINE_GPUS, '?')}")


def _tag(key: str) -> Callable[[Mapping[str, str]], str]:
    return lambda tags: tags.get(key, UNKNOWN)


COLUMNS: dict[str, Callable[[Mapping[str, str]], str]] = {
    "code": code_label, "machine": machine_label, "ray": _tag(names.VERSION_RAY),
    "rllib": _tag(names.VERSION_RLLIB), "torch": _tag(names.VERSION_TORCH),
}


def _distinct(trials: list[Trial], label: Callable[[Mapping[str, str]], str]) -> str:
    """The one value of the trials, or each value with its number of runs."""
    counts = Counter(label(t.provenance) for t in trials)
    if len(counts) == 1:
        return next(iter(counts))
    return "; ".join(f"{value} ({n} runs)" for value, n in counts.most_common())


def provenance_table(groups: list[Group]) -> pd.DataFrame:
    """One row per configuration: what ran it (:data:`COLUMNS`), every distinct value."""
    return pd.DataFrame([{"experiment": g.experiment, "algorithm": g.algorithm, **g.trials[0].subject,
                          "config": g.config_label, **{c: _distinct(g.trials, f) for c, f in COLUMNS.items()}}
                         for g in groups])


def mixed_code_versions(trials: list[Trial]) -> list[str]:
    """A warning per experiment whose runs were made by more than one code version."""
    by_experiment: dict[str, list[Trial]] = {}
    for trial in trials:
        by_experiment.setdefault(trial.experiment, []).append(trial)
    return [f"experiment {name!r} mixes code versions: {_distinct(members, code_label)}"
            for name, members in sorted(by_experiment.items())
            if len({code_label(t.provenance) for t in members}) > 1]


def mixed_settings(groups: list[Group]) -> list[str]:
    """A warning per experiment some of whose configurations have seeds that ran with
    different settings (their trials' MLflow params differ other than in the seed): the report
    averages them as seeds of one configuration."""
    mixed: dict[str, tuple[int, dict[str, set[str]]]] = {}
    for g in groups:
        keys = {k for t in g.trials for k in t.params} - {"seed"}
        differ = {k: {t.params.get(k, "(default)") for t in g.trials} for k in keys}
        differ = {k: values for k, values in differ.items() if len(values) > 1}
        if differ:
            count, settings = mixed.get(g.experiment, (0, {}))
            for k, values in differ.items():
                settings.setdefault(k, set()).update(values)
            mixed[g.experiment] = (count + 1, settings)
    return [f"experiment {name!r}: the seeds of {count} of its configurations ran with different settings ("
            + "; ".join(f"{k}: {', '.join(sorted(v))}" for k, v in sorted(settings.items()))
            + "), from sweeps of different specs; give each spec its own experiment (haepo sweep --experiment NAME)"
            for name, (count, settings) in sorted(mixed.items())]


def check_commit(trials: list[Trial], commit: str) -> list[str]:
    """Raises :class:`ProvenanceError` naming the runs not made by ``commit`` (a full or
    abbreviated hash); returns a warning for runs made by it with uncommitted changes."""
    if not re.fullmatch(r"[0-9a-f]{7,40}", commit):
        raise ProvenanceError(f"a required commit is a git hash of 7 to 40 hex digits, got {commit!r}")
    other = [t for t in trials if not t.provenance.get(names.CODE_COMMIT, "").startswith(commit)]
    if other:
        raise ProvenanceError(
            f"{len(other)} of {len(trials)} runs were not made by commit {commit[:12]}: "
            f"{_distinct(other, code_label)} (experiments {sorted({t.experiment for t in other})}); "
            "re-run them with this checkout, or report them without requiring its commit")
    dirty = [t for t in trials if t.provenance.get(names.CODE_DIRTY) == "true"]
    if dirty:
        changed = changed_files(p for t in dirty for p in changed_paths(t.provenance.get(names.CODE_CHANGED, "")))
        where = f" (to {changed})" if changed else ""
        return [f"{len(dirty)} of {len(trials)} runs were made from commit {commit[:12]} with uncommitted "
                f"changes{where}: what they ran may not be that commit"]
    return []
