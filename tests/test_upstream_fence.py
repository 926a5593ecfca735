"""Every private name of an upstream library lives in :mod:`haepo_ray.upstream`, read from the
package's source: a test that fails on one used anywhere else, and that tests its own checker.

A *private upstream name* is, in code outside the fence:

- an import from a module of another package with a ``_``-prefixed part
  (``ray.train._internal.storage``), or of a ``_``-prefixed name from one
  (``from ray.tune.registry import _global_registry``);
- an attribute ``x._name`` (or ``getattr(x, "_name")``) where ``_name`` is not one the package
  defines itself (a function, a class, a class attribute, a ``self._name`` it assigns), nor
  one of :data:`PUBLIC_UNDERSCORED`;
- inside a class with an upstream base, ``self._name`` read, or ``def _name`` overriding a
  method, where an upstream base defines ``_name`` (in its class or as ``self._name`` in its
  source): a subclass's private hooks into its base;
- a string naming one of the fence's environment variables (:data:`ENV_VARIABLES`).
"""

from __future__ import annotations

import ast
import functools
import importlib
from pathlib import Path

import pytest

from haepo_ray.upstream.declared import on_self

PACKAGE = Path(__file__).resolve().parent.parent / "haepo_ray"
FENCE = PACKAGE / "upstream"

# Underscored names that are documented public API of Python's standard library.
PUBLIC_UNDERSCORED = {
    "_getframe",  # sys._getframe: documented, CPython's frame access
    "_replace", "_asdict", "_fields", "_make",  # collections.namedtuple's documented methods
}


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def own_names(paths: list[Path]) -> set[str]:
    """The underscored names the package defines itself."""
    names: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    for t in ast.walk(target):
                        if isinstance(t, ast.Name):
                            names.add(t.id)
                        elif (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                              and t.value.id in ("self", "cls")):
                            names.add(t.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.keyword) and node.arg:
                names.add(node.arg)
    return {n for n in names if is_private(n)}


@functools.cache
def _upstream_defines(cls: type, name: str) -> bool:
    """An upstream base of ``cls`` has ``name`` (as a class attribute, or ``self.<name>`` in its
    source)."""
    for base in cls.__mro__[1:]:
        if base.__module__.split(".")[0] in ("haepo_ray", "builtins"):
            continue
        if name in vars(base) or on_self(base, name):
            return True
    return False


@functools.cache
def _class_of(module: str, qualname: str) -> type | None:
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj if isinstance(obj, type) else None


def private_uses(path: Path, module: str, own: set[str], env_variables: set[str] = frozenset()
                 ) -> list[tuple[int, str, str]]:
    """(line, name, how) for each private upstream name ``path`` uses (the module docstring's
    rules)."""
    tree = ast.parse(path.read_text())
    found: list[tuple[int, str, str]] = []

    def foreign(name: str) -> bool:
        return name.split(".")[0] not in ("haepo_ray", "__future__")

    def visit(node: ast.AST, classes: list[tuple[ast.ClassDef, str]]) -> None:
        if isinstance(node, ast.ClassDef):
            qual = ".".join([c.name for c, _ in classes] + [node.name])
            classes = [*classes, (node, qual)]
        cls_node, cls = (classes[-1][0], _class_of(module, classes[-1][1])) if classes else (None, None)
        if isinstance(node, ast.Import):
            for alias in node.names:
                if foreign(alias.name) and any(is_private(p) for p in alias.name.split(".")):
                    found.append((node.lineno, alias.name, "import"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and foreign(node.module):
            if any(is_private(p) for p in node.module.split(".")):
                found.append((node.lineno, node.module, "import"))
            for alias in node.names:
                if is_private(alias.name):
                    found.append((node.lineno, alias.name, f"from {node.module} import"))
        elif isinstance(node, ast.Attribute) and is_private(node.attr) and node.attr not in PUBLIC_UNDERSCORED:
            on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls") or (
                isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "super")
            if on_self and cls_node is not None:
                if cls is not None and _upstream_defines(cls, node.attr):
                    found.append((node.lineno, node.attr, "an upstream base's, on self"))
            elif node.attr not in own:
                found.append((node.lineno, node.attr, "attribute"))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and is_private(node.name) \
                and cls is not None and _upstream_defines(cls, node.name) and classes[-1][0] is cls_node \
                and node in cls_node.body:
            found.append((node.lineno, node.name, "overrides an upstream base's"))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "setattr", "hasattr", "delattr") \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str) and is_private(node.args[1].value) \
                and node.args[1].value not in own:
            found.append((node.lineno, node.args[1].value, node.func.id))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in env_variables:
            found.append((node.lineno, node.value, "environment variable"))
        for child in ast.iter_child_nodes(node):
            visit(child, classes)

    visit(tree, [])
    return sorted(set(found))


def package_files(package: Path = PACKAGE) -> list[Path]:
    return sorted(package.rglob("*.py"))


def probe(tmp_path: Path, monkeypatch, package: str, source: str) -> list[tuple[int, str]]:
    """(line, name) of the private upstream names in ``source``, a module of an importable package."""
    folder = tmp_path / package
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "probe.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    uses = private_uses(folder / "probe.py", f"{package}.probe", own_names([folder / "probe.py"]), {"RAY_AIR_NEW_OUTPUT"})
    return [(line, name) for line, name, _ in uses]


def test_the_checker_sees_each_kind_of_private_name(tmp_path, monkeypatch):
    assert probe(tmp_path, monkeypatch, "haepo_ray_probe",
        "import sys\n"
        "from ray.tune.registry import _global_registry\n"           # 2: a private name
        "from ray.train._internal.storage import StorageContext\n"  # 3: a private module
        "from json.decoder import JSONDecoder\n"
        "class Mine:\n"
        "    def _helper(self):\n"
        "        self._count = 1\n"
        "        return self._count\n"
        "def f(tuner, mine, frame=sys._getframe()):\n"
        "    mine._helper()\n"                                        # own: not flagged
        "    getattr(tuner, '_secret')\n"                             # 11
        "    return tuner._local_tuner\n"                             # 12
        "ENV = 'RAY_AIR_NEW_OUTPUT'\n"                                # 13
        "class Sub(JSONDecoder):\n"
        "    def _own(self):\n"
        "        return self.parse_object, self._own\n"
    ) == [
        (2, "_global_registry"), (3, "ray.train._internal.storage"), (11, "_secret"), (12, "_local_tuner"),
        (13, "RAY_AIR_NEW_OUTPUT")]


def test_the_checker_sees_a_subclass_reaching_into_its_upstream_base(tmp_path, monkeypatch):
    assert probe(tmp_path, monkeypatch, "haepo_ray_probe_sub",
        "import argparse\n"
        "class Parser(argparse.ArgumentParser):\n"
        "    def _get_values(self, action, strings):\n"  # 3: overrides the base's private method
        "        return self._actions, self._mine\n"      # 4: the base's; _mine is not
    ) == [(3, "_get_values"), (4, "_actions")]


def test_no_private_upstream_name_outside_the_fence():
    from haepo_ray.upstream import internals

    files = package_files()
    own = own_names([p for p in files if FENCE not in p.parents])
    outside = {}
    for path in files:
        if FENCE in path.parents:
            continue
        uses = private_uses(path, module_name(path, PACKAGE), own, {i.name for i in internals() if i.kind == "env"})
        if uses:
            outside[str(path.relative_to(PACKAGE.parent))] = uses
    assert outside == {}


def test_the_fence_declares_every_private_name_it_uses():
    """The fence's lists (``INTERNALS`` of each module) are the fence's code: each private name a
    fence module uses is declared, and each declared private name is used (a private module's
    names count under the module's, e.g. ``ray.train._internal.storage``)."""
    from haepo_ray.upstream import internals

    declared = {i.name for i in internals() if is_private(i.name) or i.kind == "env"}
    declared_modules = {i.owner.partition(":")[0] for i in internals()}
    files = sorted(FENCE.glob("*.py"))
    own = own_names([p for p in package_files() if FENCE not in p.parents])
    own |= own_names(files) - declared
    env_variables = {i.name for i in internals() if i.kind == "env"}
    used, modules = set(), set()
    for path in files:
        for _, name, how in private_uses(path, module_name(path, PACKAGE), own, env_variables):
            (modules if how == "import" else used).add(name)
    assert used - declared == set(), "used in the fence, not declared in INTERNALS"
    assert declared - used == set(), "declared in INTERNALS, used nowhere in the fence"
    assert modules - declared_modules == set(), "private modules imported, none of whose names is declared"


def test_a_renamed_or_re_signed_name_is_found():
    from haepo_ray.upstream import Internal

    assert Internal("json:JSONDecoder", "decode", "probe", ("self", "s", "_w")).problem() is None
    assert "takes" in Internal("json:JSONDecoder", "decode", "probe", ("self", "s")).problem()
    assert "gone" in Internal("json:JSONDecoder", "_no_such", "probe").problem()
    assert Internal("json.decoder:JSONDecoder", "parse_object", "probe", kind="instance").problem() is None
    assert "no longer" in Internal("json.decoder:JSONDecoder", "_absent", "probe", kind="instance").problem()
    assert Internal("json.decoder", "NaN", "probe", kind="env").problem() is None


def _internals():
    from haepo_ray.upstream import internals

    return internals()


@pytest.mark.parametrize("internal", _internals(), ids=lambda i: f"{i.owner}.{i.name}")
def test_every_private_name_the_fence_uses_exists_as_expected(internal):
    """Fails on an upgrade that renamed, removed or re-signed one, before any sweep runs."""
    assert internal.problem() is None
