"""Whether a sweep was interrupted (Ctrl-C), and each trial's status at that moment.

Ray Tune 2.60 takes SIGINT (and SIGUSR1) as "stop the sweep": it ends its loop, saves the
experiment state that ``--resume`` restores, then stops the running trials and marks them
TERMINATED, as if they had finished; ``Tuner.fit`` returns as after a whole sweep, and nothing
it hands back says that the sweep was cut short. :class:`InterruptWatch`, a Tune callback,
wraps Tune's handler of those signals (``tune.run`` installs it before it calls the callbacks'
``setup``) and records the trials' statuses when the first one comes. A second Ctrl-C raises
``KeyboardInterrupt`` (Tune puts back the handler it found) and skips Tune's last save.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ray.tune import Callback

__all__ = ["InterruptWatch", "SIGNALS"]

SIGNALS = (signal.SIGINT, signal.SIGUSR1)  # the signals Tune 2.60 ends a sweep on, saving its state


class InterruptWatch(Callback):
    """Records :attr:`statuses` (trial id -> Tune status) when a sweep is interrupted."""

    def __init__(self) -> None:
        self.statuses: dict[str, str] | None = None  # None: not interrupted
        self._trials: list = []
        self._tune_handlers: dict[int, Callable[[int, Any], Any]] = {}

    def __reduce__(self):
        # Tune pickles its callbacks into tuner.pkl: a new watch, never this run's state.
        return type(self), ()

    def at_interrupt(self) -> Mapping[str, str] | None:
        """:attr:`statuses`, as a function (what :class:`haepo_ray.tracking.MLflowSweepCallback` asks)."""
        return self.statuses

    def setup(self, **info) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread gets signals (Tune catches none either)
        for sig in SIGNALS:
            handler = signal.getsignal(sig)
            if callable(handler):
                self._tune_handlers[sig] = handler
                signal.signal(sig, self._on_signal)

    def on_step_begin(self, iteration, trials, **info) -> None:
        self._trials = trials  # Tune's own list: trials it adds later are in it

    def _on_signal(self, signum: int, frame) -> None:
        if self.statuses is None:
            self.statuses = {trial.trial_id: trial.status for trial in self._trials}
        self._tune_handlers[signum](signum, frame)

    def on_experiment_end(self, trials, **info) -> None:
        self.release()

    def release(self) -> None:
        """Puts Tune's handlers back (idempotent; also where ``fit`` raised before the end)."""
        for sig, handler in self._tune_handlers.items():
            if signal.getsignal(sig) == self._on_signal:  # not already put back by Tune's handler
                signal.signal(sig, handler)
        self._tune_handlers.clear()
