"""What the fence declares: each private upstream name it uses (:class:`Internal`) and each
patch or override it installs (:class:`Patch`), with the versions it was written and tested for
and the internals it relies on.

Imports no upstream library: the fence's modules import theirs.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["PATCHES_SETTING", "UNTESTED", "Internal", "Patch", "PatchSettingError", "UpstreamVersionError",
           "check_patches", "installed_version", "keeps", "pick", "refusal", "setting", "untested_warning"]

# Comma-separated: "all" (the default): every patch; "required": only those a sweep's
# correctness needs (the optional ones only save time or memory); the optional ones named by
# their keys (:data:`OPTIONAL`), e.g. "connectors,actors", besides the required ones; and
# "untested" (:data:`UNTESTED`), with any of those: patches run on a library version they were
# not tested with, as long as the internals each relies on are unchanged.
PATCHES_SETTING = "HAEPO_PATCHES"
UNTESTED = "untested"
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

    @property
    def key(self) -> str:
        """``Class.name`` (or ``module.name``): how a :class:`Patch` names it (:func:`pick`)."""
        return f"{self.owner.replace(':', '.').rpartition('.')[2]}.{self.name}"

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
    """Whether the source of ``cls`` itself (not its bases) uses ``self.<name>`` (for a mangled
    name, ``_Class__x``, ``self.__x`` in class ``Class``)."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return False
    mangled = re.fullmatch(r"_([A-Za-z]\w*?)(__\w+)", name)
    if mangled and mangled.group(1) == cls.__name__:
        name = mangled.group(2)
    return re.search(rf"self\.{re.escape(name)}\b", source) is not None


class UpstreamVersionError(RuntimeError):
    """Patches met a version of their library they were not tested for (the message says which,
    and whether the internals they rely on changed)."""


class PatchSettingError(ValueError):
    """A :data:`PATCHES_SETTING` value that names no setting."""


def pick(internals: tuple[Internal, ...], *keys: str) -> tuple[Internal, ...]:
    """Those of ``internals`` whose :attr:`Internal.key` is one of ``keys``, in their order."""
    found = {i.key: i for i in internals}
    missing = [k for k in keys if k not in found]
    if missing:
        raise KeyError(f"no internal {missing} declared; declared: {sorted(found)}")
    return tuple(found[k] for k in keys)


def setting(value: str | None = None) -> frozenset[str]:
    """The parts of a :data:`PATCHES_SETTING` value (this process's, by default); raises
    :class:`PatchSettingError` on one it does not know."""
    value = os.environ.get(PATCHES_SETTING, "all") if value is None else value
    chosen = frozenset(part.strip() for part in value.split(",")) - {""}
    unknown = sorted(chosen - {"all", "required", UNTESTED, *OPTIONAL})
    if unknown:
        raise PatchSettingError(
            f"{PATCHES_SETTING}={value!r}: {unknown} unknown; it takes 'all', 'required' or optional patches by "
            f"key: {', '.join(OPTIONAL)}, and '{UNTESTED}' beside them (patches on an untested version whose "
            "internals are unchanged)")
    return chosen


def installed_version(library: str) -> str:
    """The installed version of ``library`` (an importable module name), as its
    ``__version__`` gives it, less a local part (torch's ``2.13.0+cpu``: ``2.13.0``)."""
    return str(importlib.import_module(library).__version__).partition("+")[0]


@dataclass(frozen=True)
class Patch:
    """A change of an upstream library's behaviour, installed by ``install`` (idempotent), or an
    override of its private names (``install`` does nothing: a subclass or a function of the
    fence overrides them where it is used). ``internals``: what it relies on, checked with
    :meth:`Internal.problem` on a version it was not tested for. An optional patch (``key`` in
    :data:`OPTIONAL`) only saves time or memory (measured in its module's docstring), and
    ``HAEPO_PATCHES`` can leave it out."""

    name: str
    library: str  # the module whose __version__ it was tested with
    tested: tuple[str, ...]
    key: str | None  # None: required
    install: Callable[[], None]
    internals: tuple[Internal, ...] = ()

    def __post_init__(self) -> None:
        if self.key is not None and self.key not in OPTIONAL:
            raise ValueError(f"patch {self.name!r}: key {self.key!r} is not in OPTIONAL")

    @property
    def optional(self) -> bool:
        return self.key is not None

    def changed(self) -> list[str]:
        """What changed of the internals it relies on (existence and signature); [] if nothing."""
        return [problem for internal in self.internals if (problem := internal.problem())]

    def wanted(self, chosen: frozenset[str] | None = None) -> bool:
        """Whether the setting (this process's, by default) keeps it."""
        return keeps(setting() if chosen is None else chosen, self.key)

    def check(self, version: str | None = None) -> str | None:
        """None on a tested version (``version``: in place of the installed one); on another, a
        warning when the setting allows untested versions and no internal it relies on changed;
        else raises :class:`UpstreamVersionError` (:func:`refusal`)."""
        warnings = check_patches([self], {self.library: version} if version else None)
        return warnings[0] if warnings else None

    def apply(self) -> bool:
        """Checks the version (a warning is logged once per process) and installs the patch
        unless the setting leaves it out; returns whether it is installed."""
        if not self.wanted():
            return False
        warning = self.check()
        if warning and warning not in _warned:
            _warned.add(warning)
            logging.getLogger("haepo_ray.upstream").warning(warning)
        self.install()
        return True


_warned: set[str] = set()


def keeps(chosen: frozenset[str], key: str | None) -> bool:
    """Whether the setting's parts ``chosen`` keep the patch of ``key`` (None: a required one)."""
    chosen = chosen - {UNTESTED}
    return key is None or not chosen or "all" in chosen or key in chosen


def check_patches(patches: list[Patch], versions: dict[str, str] | None = None) -> list[str]:
    """Checks ``patches`` (those the setting keeps) against the installed versions of their
    libraries (``versions``: library -> version, in place of the installed ones); returns one
    warning per library they run on untested (the setting allows it and no internal they rely on
    changed); raises :class:`UpstreamVersionError` with a :func:`refusal` per library otherwise."""
    chosen = setting()
    by_library: dict[str, list[Patch]] = {}
    for patch in patches:
        if patch.wanted(chosen):
            by_library.setdefault(patch.library, []).append(patch)
    warnings, refused = [], []
    for library, group in by_library.items():
        installed = (versions or {}).get(library) or installed_version(library)
        untested = [p for p in group if installed not in p.tested]
        if not untested:
            continue
        changed = {p.name: p.changed() for p in untested}
        if UNTESTED in chosen and not any(changed.values()):
            warnings.append(untested_warning(library, installed, untested))
        else:
            refused.append(refusal(library, installed, untested, changed, chosen))
    if refused:
        raise UpstreamVersionError(" ".join(refused))
    return warnings


def _names(patches: list[Patch]) -> str:
    return ", ".join(f"'{p.name}'" for p in patches)


def _tested(patches: list[Patch]) -> str:
    return " / ".join(dict.fromkeys(v for p in patches for v in p.tested))


def untested_warning(library: str, installed: str, patches: list[Patch]) -> str:
    """The line logged (and tagged on a sweep's parent run) for patches run untested."""
    return (f"{PATCHES_SETTING}={UNTESTED}: haepo-ray's patches {_names(patches)} run on "
            f"{library} {installed}, untested (tested: {library} {_tested(patches)}); the internals they rely on "
            "are unchanged")


def refusal(library: str, installed: str, patches: list[Patch], changed: dict[str, list[str]],
            chosen: frozenset[str]) -> str:
    """One paragraph: the patches that met an untested version, both versions, each patch whose
    internals changed and how, and the setting that runs the sweep anyway, if one does."""
    text = (f"haepo-ray's patches {_names(patches)} were written and tested for "
            f"{library} {_tested(patches)}, and {library} {installed} is installed.")
    broken = [p for p in patches if changed[p.name]]
    if broken:
        text += (f" The internals they rely on changed in {library} {installed} for "
                 + ", ".join(f"'{p.name}' ({'; '.join(changed[p.name])})" for p in broken)
                 + (f"; they are unchanged for {_names([p for p in patches if p not in broken])}."
                    if len(broken) < len(patches) else "."))
    else:
        text += f" The internals they rely on are unchanged in {library} {installed}."
    text += " Install the tested versions (`make setup`, requirements/)"
    if any(not p.optional for p in broken):
        return text + ": a required patch cannot run on this version."
    # The setting that runs the rest untested: the optional patches kept now, less the changed ones.
    kept = [key for key in OPTIONAL if key not in {p.key for p in broken} and keeps(chosen, key)]
    parts = (kept or ["required"]) if broken else sorted(chosen - {UNTESTED, "all"})
    suggested = ",".join([*parts, UNTESTED])
    return (text + f", or set {PATCHES_SETTING}={suggested} to run "
            + ("without the changed optional patches and the others " if broken else "them ")
            + "untested (a warning in the log and a tag on the sweep's MLflow parent run).")
