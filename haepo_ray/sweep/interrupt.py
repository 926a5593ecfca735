"""Whether a sweep was interrupted (Ctrl-C, ``haepo stop``, ``kill``), by which signal, and each
trial's status at that moment.

Ray Tune 2.60 takes SIGINT (and SIGUSR1) as "stop the sweep": it ends its loop, saves the
experiment state that ``--resume`` restores, then stops the running trials and marks them
TERMINATED, as if they had finished; ``Tuner.fit`` returns as after a whole sweep, and nothing
it hands back says that the sweep was cut short. :class:`InterruptWatch`, a Tune callback,
wraps Tune's handler of those signals (``tune.run`` installs it before it calls the callbacks'
``setup``) and records the trials' statuses when the first one comes. A second Ctrl-C raises
``KeyboardInterrupt`` (Tune puts back the handler it found) and skips Tune's last save.

SIGTERM, what Ray Jobs (``haepo stop``), Kubernetes, SLURM and ``kill`` send, is not Tune's: the
driver aborted in Ray's handler with every running trial's MLflow run left RUNNING. The watch
hands the first SIGTERM to Tune's handler as well, and puts back the one it found for a second.
Where Ray's own processes got it too (a signal to the whole process group: SLURM's ``scancel``,
an embedded Ray), Tune saves its state but then waits on Ray for a minute as it stops the
trials, and dies without ending anything; so a sweep whose trials Tune has not stopped
:data:`SIGTERM_GRACE_S` after a SIGTERM (the watch's ``on_experiment_end``, which comes after
that, first of the callbacks') is handed to ``on_stuck``, from a thread of the watch's.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ray.tune import Callback

from haepo_ray.tracking.retry import env_number

logger = logging.getLogger(__name__)

__all__ = ["InterruptWatch", "SIGNALS", "SIGTERM_GRACE_S", "sigterm_grace_s"]

TUNE_SIGNALS = (signal.SIGINT, signal.SIGUSR1)  # the signals Tune 2.60 ends a sweep on, saving its state
SIGNALS = (*TUNE_SIGNALS, signal.SIGTERM)  # what the watch takes during a sweep
# A sweep ends within a few seconds of a SIGTERM (Ray Jobs' stop waits 3 s unless told
# otherwise); SLURM and Kubernetes send SIGKILL 30 s after it, by default. HAEPO_SIGTERM_GRACE_S
# sets it for haepo sweep and haepo train (where those are set otherwise).
SIGTERM_GRACE_S = 20.0


def sigterm_grace_s() -> float:
    """``HAEPO_SIGTERM_GRACE_S``, or :data:`SIGTERM_GRACE_S` where it is not set."""
    return env_number("HAEPO_SIGTERM_GRACE_S", SIGTERM_GRACE_S)


class InterruptWatch(Callback):
    """Records :attr:`statuses` (trial id -> Tune status) and :attr:`signal` (its name) when a
    sweep is interrupted. ``on_stuck(trials)``: called with Tune's trials, from another thread,
    when Tune has not stopped them ``grace_s`` after a SIGTERM (it should end the process)."""

    def __init__(self, on_stuck: Callable[[list], None] | None = None, grace_s: float = SIGTERM_GRACE_S) -> None:
        self.statuses: dict[str, str] | None = None  # None: not interrupted
        self.signal: str | None = None
        self._trials: list = []
        self._found: dict[int, Any] = {}  # the handlers the watch replaced
        self._on_stuck, self._grace_s = on_stuck, grace_s
        self._ended = threading.Event()

    def __reduce__(self):
        # Tune pickles its callbacks into tuner.pkl: a new watch, never this run's state.
        return type(self), ()

    def at_interrupt(self) -> Mapping[str, str] | None:
        """:attr:`statuses`, as a function (what :class:`haepo_ray.tracking.MLflowSweepCallback` asks)."""
        return self.statuses

    def setup(self, **info) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread gets signals (Tune catches none either)
        if not callable(signal.getsignal(signal.SIGUSR1)):
            return  # Tune's handler is not there to end the sweep
        for sig in SIGNALS:
            handler = signal.getsignal(sig)
            if sig == signal.SIGTERM or callable(handler):
                self._found[sig] = handler
                signal.signal(sig, self._on_signal)

    def on_step_begin(self, iteration, trials, **info) -> None:
        self._trials = trials  # Tune's own list: trials it adds later are in it

    def _on_signal(self, signum: int, frame) -> None:
        if self.statuses is None:
            self.statuses = {trial.trial_id: trial.status for trial in self._trials}
            self.signal = signal.Signals(signum).name
        if signum in TUNE_SIGNALS:
            self._found[signum](signum, frame)
        else:  # Tune's handler, which is the same for both of its signals; a second SIGTERM is not Tune's
            self._put_back(signum)
            self._found[signal.SIGUSR1](signal.SIGUSR1, frame)
            if self._on_stuck is not None:
                threading.Thread(target=self._await_end, args=(self._on_stuck,), name="haepo-sigterm-grace",
                                 daemon=True).start()

    def _await_end(self, on_stuck: Callable[[list], None]) -> None:
        if not self._ended.wait(self._grace_s):
            logger.warning("Tune has not stopped the trials %g s after SIGTERM (Ray's own processes were "
                           "stopped too?): ending the sweep without Ray", self._grace_s)
            on_stuck(list(self._trials))

    def on_experiment_end(self, trials, **info) -> None:
        self.release()

    def release(self) -> None:
        """Puts back the handlers the watch found (idempotent; also where ``fit`` raised before
        the end): the sweep has ended."""
        self._ended.set()
        for sig in list(self._found):
            self._put_back(sig)

    def _put_back(self, sig: int) -> None:
        handler: Callable | int | None = self._found.pop(sig)
        if signal.getsignal(sig) == self._on_signal:  # not already put back by Tune's handler
            # None: a handler not set from Python (Ray's own, in C), which Python cannot put back
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
