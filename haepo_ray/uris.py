"""What kind of place a location string names: a URI, or an HTTP(S) server."""

from __future__ import annotations


def is_uri(location: str) -> bool:
    """Whether ``location`` is a URI with a scheme (``s3://bucket/x``, ``file:///x``,
    ``http://host``): it contains ``://``. Anything else is a local filesystem path."""
    return "://" in location


def is_http_url(location: str) -> bool:
    """Whether ``location`` starts with ``http://`` or ``https://``: a server (an MLflow
    tracking server, Ray's dashboard), not a file, a database or another store."""
    return location.startswith(("http://", "https://"))
