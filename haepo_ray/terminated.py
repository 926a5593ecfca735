"""SIGTERM (``kill``, Ray Jobs' stop, Kubernetes, SLURM) as the Ctrl-C it ends as:
:class:`Terminated`, and :func:`sigterm_raises_terminated` for the stretches of a command where
nothing else takes it."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where a Ctrl-C's ``KeyboardInterrupt`` is, so that it ends what a Ctrl-C
    ends (exit status 143)."""


def _raise_terminated(signum: int, frame) -> None:
    raise Terminated()


@contextmanager
def sigterm_raises_terminated() -> Iterator[None]:
    """Inside (in the main thread), SIGTERM raises :class:`Terminated`; the handler found is put
    back after. After ``ray.init`` a driver's SIGTERM goes to Ray's C++ handler, which aborts
    the process (SIGABRT) with nothing ended: a sweep's parent run stays RUNNING in MLflow."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    found = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:  # None: a handler not set from Python (Ray's own, in C), which Python cannot set back
        signal.signal(signal.SIGTERM, signal.SIG_DFL if found is None else found)
