"""The one error type of the ``haepo`` command, the exit status of an interrupted one, and
where its warnings go."""

from __future__ import annotations

import logging
import signal


def exit_status(signum: int) -> int:
    """The exit status of a command that signal ``signum`` ended, as a shell reports it."""
    return 128 + signum


INTERRUPTED = exit_status(signal.SIGINT)  # 130: a command a Ctrl-C ended
TERMINATED = exit_status(signal.SIGTERM)  # 143: ... that SIGTERM ended


class UsageError(Exception):
    """A bad command line or setting: printed without a traceback, exit code 2."""


def configure_logging() -> None:
    """Warnings of haepo_ray (MLflow trouble above all) go to stderr with a time stamp."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
