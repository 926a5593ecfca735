"""``ray.init`` that a SIGTERM or Ctrl-C cannot cut short into processes left running.

While ``ray.init`` starts a local node, a SIGTERM runs the handler Ray sets first, which calls
``sys.exit(15)``, and a Ctrl-C raises ``KeyboardInterrupt``, wherever start-up is. Cut short
before Ray has recorded its node (while it waits for its raylet, say), the node is not
``ray.shutdown``'s to end: the raylet and GCS end with this process, but the raylet's dashboard
and runtime-env agents go on running, parented to init (Ray 2.60: two per cut-short start,
still there minutes later). :func:`start_ray` ends what such a start had started, and a SIGTERM
then ends as :class:`~haepo_ray.terminated.Terminated`.
"""

from __future__ import annotations

import signal
from typing import Any

from haepo_ray.terminated import Terminated

__all__ = ["start_ray"]


def start_ray(**init_kwargs: Any) -> None:
    """``ray.init(**init_kwargs)``; if it does not return, the processes it started (this
    process's new children and theirs) are ended before its exception goes on, Ray's
    ``SystemExit`` for a SIGTERM as :class:`~haepo_ray.terminated.Terminated`."""
    import psutil
    import ray

    me = psutil.Process()
    before = {p.pid for p in me.children()}
    ours = not ray.is_initialized()  # else ray.init refuses, and the Ray that is up is not its to end
    try:
        ray.init(**init_kwargs)
    except BaseException as err:
        if not ours:
            raise
        try:
            ray.shutdown()  # what Ray had recorded of the start
        finally:
            _end([p for p in me.children() if p.pid not in before])
        if isinstance(err, SystemExit) and err.code == signal.SIGTERM:
            raise Terminated() from None
        raise


def _end(children: list) -> None:
    """Stops ``children`` and their descendants (stopped, none can start another), then kills them."""
    import psutil

    stopped: dict[int, psutil.Process] = {}
    found = children
    while found:
        for p in found:
            try:
                p.suspend()
                stopped[p.pid] = p
            except psutil.Error:  # ended already
                pass
        found = [c for p in found if p.pid in stopped for c in _children(p) if c.pid not in stopped]
    for p in stopped.values():
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(list(stopped.values()), timeout=5)


def _children(process) -> list:
    import psutil

    try:
        return process.children()
    except psutil.Error:
        return []
