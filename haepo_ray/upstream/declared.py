"""What the fence declares: each private upstream name it uses (:class:`Internal`) and each
patch it installs (:class:`Patch`), with the versions a patch was written and tested for.

Imports no upstream library: the fence's modules import theirs.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["PATCHES_SETTING", "Internal", "Patch", "UpstreamVersionError"]

# "all" (the default): every patch; "required": only those a sweep's correctness needs (the
# optional ones only save time or memory); or the required ones and the optional ones named,
# comma-separated, by their keys (:data:`OPTIONAL`), e.g. "connectors,actors".
PATCHES_SETTING = "HAEPO_PATCHES"
OPTIONAL = {
    "actors": "Tune keeps the trial actors it launches (upstream/tune.py)",
    "release": "Tune lets go of a finished trial's running statistics (upstream/tune.py)",
    "analysis": "a resume reads no trial's results before the fit (upstream/tune.py)",
    "connectors": "RLlib builds connectors without reading source files (upstream/rllib.py)",
}


@dataclass(frozen=True)
class Internal:
    """A private upstream name the fence reads, writes, overrides or patches.

    ``owner`` is ``"module"`` or ``"module:Class"``; ``name`` is an attribute of it, or, with
    ``kind="instance"``, an attribute its instances get (``self.<name>`` in the class's or a
    base's source), or, with ``kind="env"``, an environment variable the module reads.
    ``params``, where given, are the parameter names of its signature, in order, as the fence
    calls or overrides it.
    """

    owner: str
    name: str
    reason: str
    params: tuple[str, ...] | None = None
    kind: str = "attribute"  # "attribute", "instance" or "env"

    def problem(self) -> str | None:
        """None when the installed library still has the name as expected, else what changed."""
        module_name, _, qualname = self.owner.partition(":")
        try:
            owner = importlib.import_module(module_name)
        except ImportError as error:
            return f"{module_name} does not import: {error}"
        for part in filter(None, qualname.split(".")):
            owner = getattr(owner, part, None)
            if owner is None:
                return f"{self.owner} is gone"
        if self.kind == "env":
            return None if self.name in inspect.getsource(owner) else f"{self.owner} no longer reads {self.name}"
        if self.kind == "instance":
            if any(on_self(cls, self.name) for cls in owner.__mro__):
                return None
            return f"instances of {self.owner} no longer get {self.name}"
        if not hasattr(owner, self.name):
            return f"{self.owner}.{self.name} is gone"
        if self.params is not None:
            # Less Ray's tracing parameter: Ray adds _ray_trace_ctx to the signature of every
            # method of a class it makes an actor of (RLlib's remote env runners), in place, so
            # a process that has built one sees it on the upstream class too.
            found = tuple(p for p in inspect.signature(getattr(owner, self.name)).parameters if p != "_ray_trace_ctx")
            if found != self.params:
                return f"{self.owner}.{self.name} takes {found}, expected {self.params}"
        return None


@functools.cache
def on_self(cls: type, name: str) -> bool:
    """Whether the source of ``cls`` itself (not its bases) uses ``self.<name>``."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return False
    return re.search(rf"self\.{re.escape(name)}\b", source) is not None


class UpstreamVersionError(RuntimeError):
    """A patch met a version of its library it was not tested for."""


@dataclass(frozen=True)
class Patch:
    """A change of an upstream library's behaviour, installed by ``install`` (idempotent).
    An optional patch (``key`` in :data:`OPTIONAL`) only saves time or memory (measured in its
    module's docstring), and ``HAEPO_PATCHES`` can leave it out."""

    name: str
    library: str  # the distribution whose version it was tested with
    tested: tuple[str, ...]
    key: str | None  # None: required
    install: Callable[[], None]

    def __post_init__(self) -> None:
        if self.key is not None and self.key not in OPTIONAL:
            raise ValueError(f"patch {self.name!r}: key {self.key!r} is not in OPTIONAL")

    @property
    def optional(self) -> bool:
        return self.key is not None

    def check(self) -> None:
        """Raises :class:`UpstreamVersionError` unless the installed library is a tested version."""
        installed = importlib.metadata.version(self.library)
        if installed in self.tested:
            return
        hint = (f"set {PATCHES_SETTING}=required to run without this optional patch"
                if self.optional else "this patch is required for a correct sweep")
        raise UpstreamVersionError(
            f"haepo-ray's patch {self.name!r} was written and tested for {self.library} "
            f"{' / '.join(self.tested)}, and {self.library} {installed} is installed. Install the "
            f"locked versions (`make setup`, requirements/), or {hint}.")

    def wanted(self) -> bool:
        setting = os.environ.get(PATCHES_SETTING, "all")
        chosen = {part.strip() for part in setting.split(",")} - {""}
        unknown = sorted(chosen - {"all", "required", *OPTIONAL})
        if unknown:
            raise ValueError(f"{PATCHES_SETTING}={setting!r}: {unknown} unknown; it takes 'all', 'required' "
                             f"or optional patches by key: {', '.join(OPTIONAL)}")
        return not self.optional or "all" in chosen or self.key in chosen

    def apply(self) -> bool:
        """Checks the version and installs the patch unless the setting leaves it out;
        returns whether it is installed."""
        if not self.wanted():
            return False
        self.check()
        self.install()
        return True
