"""MLflow tracking for sweeps: one parent run per sweep, one nested child run per trial,
logged from the Tune driver.

- :mod:`~haepo_ray.tracking.uri`: where to log (flag, ``MLFLOW_TRACKING_URI``, embedded SQLite);
- :mod:`~haepo_ray.tracking.schema`: what is written and in which form (params, metrics, tag
  values; the best-trial rule), which the report reads back;
- :mod:`~haepo_ray.tracking.retry`: MLflow calls with retries, and the record of what failed;
- :mod:`~haepo_ray.tracking.writer`: the background thread that writes, through outages (the
  transport); :mod:`~haepo_ray.tracking.messages` what the driver queues for it, and
  :mod:`~haepo_ray.tracking.sweep_runs` what each message does to MLflow's runs;
- :mod:`~haepo_ray.tracking.callback`: the Tune callback (parent/child runs, resume), with its
  settings in :mod:`~haepo_ray.tracking.settings`;
- :mod:`~haepo_ray.tracking.run`: one run without a parent (``haepo train``);
- :mod:`~haepo_ray.tracking.queries`: finding a sweep's runs again;
- :mod:`~haepo_ray.tracking.audit`: a sweep's rows on disk against MLflow (fault tests, chaos bench).

The callback (it subclasses Ray Tune's) loads on first use, so that readers of a store
(``haepo report``, ``haepo llm eval-form``) import no Ray.
"""

from haepo_ray.lazy import lazy_exports
from haepo_ray.tracking.queries import experiment_named, find_sweep_runs, open_store, search_all_runs
from haepo_ray.tracking.schema import (
    DEFAULT_METRICS,
    LLM_METRICS,
    SWEEP_ROLE,
    TRAIN_ROLE,
    TRIAL_ROLE,
    best,
    flatten,
    metric_value,
    rank,
    sanitize_key,
    select_metrics,
)
from haepo_ray.tracking.uri import artifact_location_for, default_tracking_uri, resolve_tracking_uri
from haepo_ray.tracking.retry import NotLogged, RetryPolicy
from haepo_ray.tracking.run import MLflowRun
from haepo_ray.tracking.settings import SweepTracking

__all__ = [
    "DEFAULT_METRICS",
    "LLM_METRICS",
    "SWEEP_ROLE",
    "TRAIN_ROLE",
    "TRIAL_ROLE",
    "MLflowRun",
    "MLflowSweepCallback",
    "NotLogged",
    "RetryPolicy",
    "SweepTracking",
    "artifact_location_for",
    "best",
    "default_tracking_uri",
    "experiment_named",
    "find_sweep_runs",
    "flatten",
    "metric_value",
    "open_store",
    "rank",
    "resolve_tracking_uri",
    "sanitize_key",
    "search_all_runs",
    "select_metrics",
]

_LAZY = {"MLflowSweepCallback": "haepo_ray.tracking.callback"}


__getattr__ = lazy_exports(__name__, _LAZY)
