"""The one error type of the ``haepo`` command."""

from __future__ import annotations


class UsageError(Exception):
    """A bad command line or setting: printed without a traceback, exit code 2."""
