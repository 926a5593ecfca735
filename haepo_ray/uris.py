"""What kind of place a location string names: a URI, or an HTTP(S) server; and whether a
server's port answers (:func:`unreachable`)."""

from __future__ import annotations

import socket


def is_uri(location: str) -> bool:
    """Whether ``location`` is a URI with a scheme (``s3://bucket/x``, ``file:///x``,
    ``http://host``): it contains ``://``. Anything else is a local filesystem path."""
    return "://" in location


def is_http_url(location: str) -> bool:
    """Whether ``location`` starts with ``http://`` or ``https://``: a server (an MLflow
    tracking server, Ray's dashboard), not a file, a database or another store."""
    return location.startswith(("http://", "https://"))


def unreachable(host: str, port: int, timeout_s: float) -> str | None:
    """None when a TCP connection to ``host:port`` opens within ``timeout_s``, else why not
    ("Connection refused", "timed out", ...): a quick check before a client that would retry
    for minutes."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as err:
        return "timed out" if isinstance(err, TimeoutError) else (err.strerror or str(err))
