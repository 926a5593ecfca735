"""Patches of RLlib 2.60 internals, each with its reason; an RLlib upgrade is checked here.

``ConnectorV2.__init__`` records its subclass's constructor arguments (for checkpoints)
from ``inspect.stack()[1].frame``. ``inspect.stack()`` builds a ``FrameInfo`` for every
frame of the call stack with its source context: for a frame of Ray's Cython core
(``python/ray/_raylet.pyx``, no such file) ``inspect.getmodule`` scans all of
``sys.modules`` each time. A Tune actor's stack has such frames, and an algorithm builds
about a dozen connectors, so the scans were most of a reused trial actor's reset: 99-104 ms
against 20-23 ms with :func:`caller_frames` (one-iteration HAEPO trials on the bandit,
``bench/trial_reset.py``; BENCHMARKS.md, "Sweeps of thousands of trials").
"""

from __future__ import annotations

import inspect
import sys
import types


def caller_frames(context: int = 1) -> list[inspect.FrameInfo]:
    """``inspect.stack()`` without reading source files: the same frames, from the caller
    outward, each with ``co_filename`` as its file and no code context (``context`` is
    accepted and ignored)."""
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        frames.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name, None, None))
        frame = frame.f_back
    return frames


class _InspectWithoutSource(types.ModuleType):
    """The ``inspect`` module as ``connector_v2`` sees it: :func:`caller_frames` as ``stack``."""

    stack = staticmethod(caller_frames)

    def __getattr__(self, name: str):
        return getattr(inspect, name)


def apply() -> None:
    """Installs the patches in this process (idempotent)."""
    from ray.rllib.connectors import connector_v2

    if not isinstance(connector_v2.inspect, _InspectWithoutSource):
        connector_v2.inspect = _InspectWithoutSource("inspect")
