"""Ctrl-C and SIGTERM as a request to stop at a command's next check (``haepo train``: after
the iteration, with its checkpoint).

A ``KeyboardInterrupt`` lands between any two bytecodes of the main thread, inside Ray, torch
or MLflow as much as in the command's own loop, and what it cuts short can stay broken: one
inside ``queue.Queue.put`` left the queue's lock held (CPython 3.11), and the MLflow run's end
waited for ever on its own put (the writer now uses a queue without a Python lock). So the
first signal only records itself, and the command stops where it checks.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import TracebackType

from haepo_ray.terminated import Terminated

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """While entered (in the main thread), the first SIGINT or SIGTERM is recorded in
    :attr:`signum` and said on stderr, and the command stops at its next check of it. A second
    one raises ``KeyboardInterrupt`` (SIGINT) or :class:`Terminated` (SIGTERM) at once, as does
    a SIGTERM that ``grace_s`` seconds have not seen stopped (the platform's SIGKILL comes next;
    SLURM's and Kubernetes' default is 30 s). A signal found ignored stays ignored; leaving puts
    back the handlers found.

    Args:
        command: what the message names, e.g. ``"haepo train"``.
        where: where the command stops, e.g. ``"after this iteration"``.
        grace_s: seconds a SIGTERM waits for the command to stop.
    """

    def __init__(self, command: str, where: str, grace_s: float) -> None:
        self.command, self.where, self.grace_s = command, where, grace_s
        self.signum: int | None = None  # the first signal; None: none came
        self._found: dict[int, object] = {}
        self._stopped = threading.Event()
        self._grace_thread: threading.Thread | None = None

    def __enter__(self) -> StopRequest:
        for sig in STOP_SIGNALS:
            found = signal.getsignal(sig)
            if found != signal.SIG_IGN:  # e.g. SIGINT of a job started with & or nohup: it stays ignored
                self._found[sig] = found
                signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._stopped.set()
        if self._grace_thread is not None:  # a SIGTERM it sent as the command stopped reaches the handler
            self._grace_thread.join()
        for sig, handler in self._found.items():  # None: a handler not set from Python, which it cannot set
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)

    def raise_if_received(self) -> None:
        """Raises what the signal asked for (``KeyboardInterrupt`` or :class:`Terminated`),
        once the command has stopped, so that :func:`haepo_ray.cli.main` reports it."""
        if self.signum is not None:
            raise _interrupt(self.signum)

    def _on_signal(self, signum: int, frame) -> None:
        if self.signum is None:
            self.signum = signum
            key = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
            print(f"\n{self.command}: {signal.Signals(signum).name}: stopping {self.where} "
                  f"({key} again stops at once)", file=sys.stderr, flush=True)
            if signum == signal.SIGTERM:
                self._grace_thread = threading.Thread(target=self._grace, name="haepo-sigterm-grace", daemon=True)
                self._grace_thread.start()
            return
        for sig in self._found:  # a third: Python's KeyboardInterrupt for SIGINT, an end at once for SIGTERM
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        raise _interrupt(signum)

    def _grace(self) -> None:
        if not self._stopped.wait(self.grace_s):
            print(f"{self.command}: not stopped {self.grace_s:g} s after SIGTERM: stopping at once",
                  file=sys.stderr, flush=True)
            # the handler's second call; a signal of the main thread's own wakes it from a sleep or a wait
            signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)


def _interrupt(signum: int) -> KeyboardInterrupt:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
