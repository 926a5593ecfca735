"""Every private name of Ray core that haepo-ray uses, each with its reason; a Ray upgrade is
checked against :data:`INTERNALS`.

- ``RAY_JOB_CONFIG_JSON_ENV_VAR``: the environment variable in which Ray's job manager hands a
  submitted job's driver its job config, runtime environment included. A sweep's driver passes
  its ``HAEPO_PATCHES`` setting to the trials' actors through ``ray.init``'s runtime environment
  (a cluster's workers do not inherit the driver's environment), which Ray merges with the
  job's and refuses when both set one variable: :func:`job_env_vars` says which the job sets.
- ``RAY_JOB_STOP_WAIT_TIME_S``: how long Ray's job supervisor waits after a job stop's SIGTERM
  before its SIGKILL (3 s), read from the job's runtime environment. A stopped sweep saves its
  state and ends its MLflow runs in a few seconds: :func:`job_stop_wait` gives it longer.
"""

from __future__ import annotations

import json
import os

from haepo_ray.upstream.declared import Internal

__all__ = ["INTERNALS", "job_env_vars", "job_stop_wait"]

_JOB_CONFIG = "RAY_JOB_CONFIG_JSON_ENV_VAR"
_STOP_WAIT = "RAY_JOB_STOP_WAIT_TIME_S"


def job_env_vars() -> dict[str, str]:
    """The environment variables a submitted job's runtime environment sets for its driver and
    actors; {} outside a submitted job."""
    config = os.environ.get(_JOB_CONFIG)
    if not config:
        return {}
    return dict((json.loads(config).get("runtime_env") or {}).get("env_vars") or {})


def job_stop_wait(seconds: int) -> dict[str, str]:
    """The environment variable of a job's runtime environment that has Ray wait ``seconds``
    between a stop's SIGTERM and its SIGKILL."""
    return {_STOP_WAIT: str(seconds)}


INTERNALS = (
    Internal("ray._private.worker", _JOB_CONFIG, "read: a submitted job's runtime environment", kind="env"),
    Internal("ray.dashboard.modules.job.job_supervisor", _STOP_WAIT, "set: a stopped job's time to end",
             kind="env"),
)
