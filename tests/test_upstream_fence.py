"""Every private name of an upstream library lives in :mod:`haepo_ray.upstream`, read from the
source of the package and of ``bench/``: a test that fails on one used anywhere else, and that
tests its own checker.

A *private upstream name* is, in code outside the fence:

- an import from a module with a ``_``-prefixed part (``ray.train._internal.storage``), or of a
  ``_``-prefixed name (``from ray.tune.registry import _global_registry``), or from a module of
  Ray, MLflow, torch, transformers or TRL that is not one of their public ones
  (:data:`PUBLIC_MODULES`: ``mlflow.store.tracking.dbmodels.models`` is not);
- an attribute ``x._name`` (or ``getattr(x, "_name")``), unless ``x`` is this project's own:
  ``self`` / ``cls`` / ``super()`` in a class none of whose upstream bases defines ``_name`` (a
  base the checker cannot resolve counts as one that does: a class made inside a function is
  checked by its bases too), or a name bound to a module, class or function of the project
  (imported from ``haepo_ray`` or a ``bench/`` module, or defined in the file), a class again
  only where no upstream base defines ``_name``; any other ``x`` (a parameter, a local, an
  attribute of something) could be anything, ``tensor._version`` included;
- ``def _name`` in a class, overriding an upstream base's ``_name``;
- a mangled name (``"_Trial__unresolved_config"``), or a ``_``-prefixed key of ``vars(x)`` or
  ``x.__dict__``;
- a string naming an environment variable of Ray, Tune, RLlib or MLflow (``RAY_...``), unless
  it is documented as public (:data:`PUBLIC_ENVIRONMENT`, MLflow's
  ``mlflow.environment_variables``);
- an assignment to an attribute of Ray, MLflow, torch, transformers or TRL (a module, or a
  class or function imported from one): a patch.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from haepo_ray.upstream.declared import on_self

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "haepo_ray"
BENCH = ROOT / "bench"
FENCE = PACKAGE / "upstream"
UPSTREAM = ("ray", "mlflow", "torch", "transformers", "trl")

# Underscored names that are documented public API of Python's standard library.
PUBLIC_UNDERSCORED = {
    "_getframe",  # sys._getframe: documented, CPython's frame access
    "_exit",  # os._exit: documented, exit without cleanup handlers
    "_replace", "_asdict", "_fields", "_make",  # collections.namedtuple's documented methods
}

# The modules of the upstream libraries that code outside the fence may import from: each
# documented in its library's API reference (a module listed covers its submodules only where
# it ends with ".").
PUBLIC_MODULES = {
    "ray", "ray.exceptions", "ray.job_submission", "ray.util.metrics", "ray.train", "ray.train.torch",
    "ray.tune", "ray.tune.logger", "ray.tune.registry", "ray.tune.result", "ray.tune.schedulers",
    "ray.tune.search", "ray.tune.search.basic_variant", "ray.tune.search.optuna", "ray.tune.search.variant_generator",
    "ray.tune.trainable", "ray.tune.integration.ray_train",
    "ray.rllib.algorithms.", "ray.rllib.callbacks.callbacks", "ray.rllib.callbacks.utils",
    "ray.rllib.connectors.connector_v2", "ray.rllib.connectors.env_to_module", "ray.rllib.core", "ray.rllib.core.columns",
    "ray.rllib.core.learner.learner_group", "ray.rllib.core.learner.torch.torch_learner",
    "ray.rllib.core.rl_module.default_model_config", "ray.rllib.core.rl_module.multi_rl_module",
    "ray.rllib.core.rl_module.rl_module",
    "ray.rllib.env.single_agent_episode", "ray.rllib.utils.checkpoints", "ray.rllib.utils.metrics",
    "ray.rllib.utils.spaces.space_utils",
    "ray.rllib.utils.typing",
    "mlflow", "mlflow.entities", "mlflow.exceptions", "mlflow.tracking", "mlflow.environment_variables",
    "torch", "torch.distributed", "torch.nn.", "torch.optim.", "torch.profiler", "torch.utils.checkpoint",
    "torch.utils.flop_counter", "torch.utils.weak", "torch.nn.functional",
    "transformers", "transformers.modeling_layers",
    "trl", "trl.models.utils", "trl.trainer.utils",
}

# Environment variables of Ray that its documentation gives users to set.
PUBLIC_ENVIRONMENT = {
    "RAY_ADDRESS",  # ray.init and the Jobs CLI
    "RAY_API_SERVER_ADDRESS",  # the Jobs CLI
    "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH",  # token authentication
    "RAY_USAGE_STATS_ENABLED",  # usage stats collection
}
ENVIRONMENT = re.compile(r"(RAY|TUNE|RLLIB|MLFLOW)_[A-Za-z0-9_]+")
MANGLED = re.compile(r"_[A-Za-z][A-Za-z0-9]*__[A-Za-z0-9_]+")


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def module_name(path: Path) -> str:
    """``haepo_ray.sweep.runner`` for a package file; ``trial_memory`` for ``bench/trial_memory.py``
    (bench's scripts import each other as top-level modules)."""
    if PACKAGE in path.parents:
        parts = path.relative_to(ROOT).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return path.stem


def public_module(name: str) -> bool:
    return name in PUBLIC_MODULES or any(p.endswith(".") and name.startswith(p) for p in PUBLIC_MODULES)


@functools.cache
def _public_mlflow_variable(name: str) -> bool:
    import mlflow.environment_variables

    return hasattr(mlflow.environment_variables, name)


@dataclass(frozen=True)
class Binding:
    """What a name of a file is bound to: ``module`` (an import of one), ``name`` (``from module
    import attribute``), or a ``def`` / ``class`` of the file (``node``)."""

    kind: str
    module: str = ""
    attribute: str = ""
    node: ast.AST | None = None

    def root(self) -> str:
        return self.module.split(".")[0]

    def resolve(self):
        """The object it names, imported; None where it does not import."""
        try:
            obj = importlib.import_module(self.module)
            return getattr(obj, self.attribute) if self.attribute else obj
        except Exception:  # a module that does not import here, an attribute it has not
            try:
                return importlib.import_module(f"{self.module}.{self.attribute}")
            except Exception:
                return None


def bindings(tree: ast.AST) -> dict[str, Binding]:
    """The names the file binds by imports, ``def`` and ``class``, in any scope (a name bound
    twice keeps its last binding)."""
    out: dict[str, Binding] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    out[alias.asname] = Binding("module", alias.name)
                else:
                    out[alias.name.split(".")[0]] = Binding("module", alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                out[alias.asname or alias.name] = Binding("name", node.module, alias.name)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = Binding("def", node=node)
        elif isinstance(node, ast.ClassDef):
            out[node.name] = Binding("class", node=node)
    return out


@functools.cache
def _upstream_defines(cls: type, name: str, own: tuple[str, ...]) -> bool:
    """A class of ``cls``'s MRO that is not the project's (nor a builtin) has ``name`` (as a class
    attribute, or ``self.<name>`` in its source)."""
    for base in cls.__mro__:
        if base.__module__.split(".")[0] in (*own, "builtins"):
            continue
        if name in vars(base) or on_self(base, name):
            return True
    return False


class Checker:
    """The private upstream names of one file (the module docstring's rules)."""

    def __init__(self, path: Path, own: tuple[str, ...], env_variables: frozenset[str] = frozenset()):
        self.path, self.own, self.env_variables = path, own, env_variables
        self.tree = ast.parse(path.read_text())
        self.bound = bindings(self.tree)
        self.exported = {elt.value for node in ast.walk(self.tree) if isinstance(node, ast.Assign)
                         and any(getattr(t, "id", None) == "__all__" for t in node.targets)
                         for elt in ast.walk(node.value) if isinstance(elt, ast.Constant)}
        self.found: list[tuple[int, str, str]] = []

    def foreign(self, module: str) -> bool:
        return module.split(".")[0] not in (*self.own, "__future__")

    def base_defines(self, cls: ast.ClassDef, name: str, seen: frozenset[int] = frozenset()) -> bool:
        """Whether an upstream base of the class ``cls`` (resolved from the file's bindings) defines
        ``name``; a base the checker cannot resolve counts as one that does."""
        for base in cls.bases:
            expr = base.value if isinstance(base, ast.Subscript) else base  # Generic[T]
            chain = []
            while isinstance(expr, ast.Attribute):
                chain.insert(0, expr.attr)
                expr = expr.value
            if not isinstance(expr, ast.Name):
                return True
            binding = self.bound.get(expr.id)
            if binding is None:
                if isinstance(getattr(builtins, expr.id, None), type) and not chain:
                    continue  # object, Exception, dict
                return True
            if binding.kind == "class":
                if id(binding.node) in seen or chain:
                    return True
                if self.base_defines(binding.node, name, seen | {id(cls)}):
                    return True
                continue
            if binding.kind == "def":
                return True
            obj = binding.resolve()
            for part in chain:
                obj = getattr(obj, part, None)
            if not isinstance(obj, type):
                return True
            if _upstream_defines(obj, name, self.own):
                return True
        return False

    def own_object(self, expr: ast.AST, name: str, classes: list[ast.ClassDef]) -> bool:
        """Whether ``expr`` (the ``x`` of ``x.<name>``) is the project's own, and ``name`` not an
        upstream base's."""
        if isinstance(expr, ast.Call) and getattr(expr.func, "id", None) == "super" or (
                isinstance(expr, ast.Name) and expr.id in ("self", "cls")):
            return bool(classes) and not self.base_defines(classes[-1], name)
        if not isinstance(expr, ast.Name) or expr.id not in self.bound:
            return False
        binding = self.bound[expr.id]
        if binding.kind == "def":
            return True
        if binding.kind == "class":
            return not self.base_defines(binding.node, name)
        if binding.root() not in self.own:
            return False
        obj = binding.resolve()
        return not (isinstance(obj, type) and _upstream_defines(obj, name, self.own))

    def upstream_root(self, expr: ast.AST) -> bool:
        """Whether ``expr`` is, or is an attribute of, a name bound to Ray, MLflow, torch,
        transformers or TRL (a module, or a class or function imported from one)."""
        while isinstance(expr, ast.Attribute):
            expr = expr.value
        binding = self.bound.get(getattr(expr, "id", None))
        return binding is not None and binding.kind in ("module", "name") and binding.root() in UPSTREAM

    def flag(self, node: ast.AST, name: str, how: str) -> None:
        self.found.append((node.lineno, name, how))

    def check_import(self, node: ast.AST) -> None:
        modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
        for module in modules:
            if not self.foreign(module):
                continue
            if any(is_private(p) for p in module.split(".")):
                self.flag(node, module, "import")
            elif module.split(".")[0] in UPSTREAM and not public_module(module):
                self.flag(node, module, "import")
        if isinstance(node, ast.ImportFrom) and self.foreign(node.module):
            for alias in node.names:
                if is_private(alias.name):
                    self.flag(node, alias.name, f"from {node.module} import")

    def check_private_key(self, node: ast.AST, container: ast.AST, key: ast.AST) -> None:
        """``vars(x)["_name"]``, ``x.__dict__["_name"]`` and their ``.get``."""
        of_dict = (isinstance(container, ast.Call) and getattr(container.func, "id", None) == "vars") or (
            isinstance(container, ast.Attribute) and container.attr == "__dict__")
        if of_dict and isinstance(key, ast.Constant) and isinstance(key.value, str) and is_private(key.value):
            self.flag(node, key.value, "a private key of an object's attributes")

    def visit(self, node: ast.AST, classes: list[ast.ClassDef]) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and getattr(node, "level", 0) == 0:
            self.check_import(node)
        elif isinstance(node, ast.Attribute) and is_private(node.attr) and node.attr not in PUBLIC_UNDERSCORED:
            if not self.own_object(node.value, node.attr, classes):
                self.flag(node, node.attr, "attribute")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and is_private(node.name) and classes \
                and node in classes[-1].body and self.base_defines(classes[-1], node.name):
            self.flag(node, node.name, "overrides an upstream base's")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "setattr", "hasattr",
                                                                              "delattr") and len(node.args) >= 2:
            name = node.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str) and is_private(name.value) \
                    and not self.own_object(node.args[0], name.value, classes):
                self.flag(node, name.value, node.func.id)
            if node.func.id in ("setattr", "delattr") and self.upstream_root(node.args[0]):
                self.flag(node, ast.unparse(node.args[0]), "patches an upstream library")
        elif isinstance(node, ast.Subscript):
            self.check_private_key(node, node.value, node.slice)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if MANGLED.fullmatch(node.value):
                self.flag(node, node.value, "a mangled private name")
            elif (ENVIRONMENT.fullmatch(node.value) or node.value in self.env_variables) \
                    and node.value not in PUBLIC_ENVIRONMENT and node.value not in self.exported \
                    and not (node.value.startswith("MLFLOW_") and _public_mlflow_variable(node.value)):
                self.flag(node, node.value, "environment variable")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and node.args:
            self.check_private_key(node, node.func.value, node.args[0])
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Attribute) and self.upstream_root(target):
                    self.flag(node, ast.unparse(target), "patches an upstream library")
        if isinstance(node, ast.ClassDef):
            classes = [*classes, node]
        for child in ast.iter_child_nodes(node):
            self.visit(child, classes)

    def uses(self) -> list[tuple[int, str, str]]:
        self.visit(self.tree, [])
        return sorted(set(self.found))


def private_uses(path: Path, own: tuple[str, ...] = ("haepo_ray",), env_variables: frozenset[str] = frozenset()
                 ) -> list[tuple[int, str, str]]:
    """(line, name, how) for each private upstream name ``path`` uses (the module docstring's
    rules); ``own``: the top-level modules that are the project's."""
    return Checker(path, own, env_variables).uses()


def checked_files() -> list[Path]:
    """The package's modules and bench's scripts."""
    return sorted(PACKAGE.rglob("*.py")) + sorted(BENCH.rglob("*.py"))


def own_modules(path: Path) -> tuple[str, ...]:
    """The project's top-level modules as ``path`` imports them: the package, and for a
    ``bench/`` script the other scripts too."""
    return ("haepo_ray",) if PACKAGE in path.parents else ("haepo_ray", *(p.stem for p in BENCH.glob("*.py")))


def probe(tmp_path: Path, monkeypatch, package: str, source: str) -> list[tuple[int, str]]:
    """(line, name) of the private upstream names in ``source``, a module of an importable package."""
    folder = tmp_path / package
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "probe.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    uses = private_uses(folder / "probe.py", ("haepo_ray", package), frozenset({"RAY_AIR_NEW_OUTPUT"}))
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
        "    Mine._helper(mine)\n"                                   # the project's class: not flagged
        "    getattr(tuner, '_secret')\n"                             # 11
        "    return tuner._local_tuner, mine._helper\n"               # 12: anything's, the package's names or not
        "ENV = 'RAY_AIR_NEW_OUTPUT'\n"                                # 13
        "class Sub(JSONDecoder):\n"
        "    def _own(self):\n"
        "        return self.parse_object, self._own\n"
        "import torch.nn.functional\n"
        "torch.nn.functional.relu = abs\n"                           # 18: a patch of an upstream module
    ) == [
        (2, "_global_registry"), (3, "ray.train._internal.storage"), (11, "_secret"), (12, "_helper"),
        (12, "_local_tuner"), (13, "RAY_AIR_NEW_OUTPUT"), (18, "torch.nn.functional.relu")]


def test_the_checker_sees_a_subclass_reaching_into_its_upstream_base(tmp_path, monkeypatch):
    assert probe(tmp_path, monkeypatch, "haepo_ray_probe_sub",
        "import argparse\n"
        "class Parser(argparse.ArgumentParser):\n"
        "    def _get_values(self, action, strings):\n"  # 3: overrides the base's private method
        "        return self._actions, self._mine\n"      # 4: the base's; _mine is not
        "def make(base):\n"
        "    class Local(argparse.ArgumentParser):\n"
        "        def f(self):\n"
        "            return self._actions\n"              # 8: a class made in a function, checked the same
        "    class Unknown(base):\n"
        "        def f(self):\n"
        "            return self._mine\n"                 # 11: a base the checker cannot resolve
        "    return Local, Unknown\n"
    ) == [(3, "_get_values"), (4, "_actions"), (8, "_actions"), (11, "_mine")]


# Each form that once passed the fence, planted in a copy of a module of the package.
PLANTED = {
    "an attribute the package defines elsewhere": ("def planted(tensor):\n    return tensor._version\n", "_version"),
    "a mangled name through vars()": ('def planted(trial):\n    return vars(trial)["_Trial__unresolved_config"]\n',
                                      "_Trial__unresolved_config"),
    "an undeclared Ray variable": ('def planted():\n    return os.environ["RAY_health_check_period_ms"]\n',
                                   "RAY_health_check_period_ms"),
    "an internal module without an underscore": ("from mlflow.store.tracking.dbmodels.models import SqlMetric\n",
                                                 "mlflow.store.tracking.dbmodels.models"),
    "a subclass made in a function": ("def planted():\n    from ray.tune import Tuner\n\n"
                                      "    class Restored(Tuner):\n        def local(self):\n"
                                      "            return self._local_tuner\n\n    return Restored\n", "_local_tuner"),
}


@pytest.mark.parametrize("form", PLANTED)
def test_the_fence_fails_on_each_planted_form(form, tmp_path):
    """In a copy of ``haepo_ray/sweep/runner.py``, which passes it as it is."""
    source = (PACKAGE / "sweep" / "runner.py").read_text()
    code, name = PLANTED[form]
    (tmp_path / "runner.py").write_text(source)
    assert private_uses(tmp_path / "runner.py") == []
    (tmp_path / "runner.py").write_text(f"{source}\n\n{code}")
    assert name in {used for _, used, _ in private_uses(tmp_path / "runner.py")}


def test_no_private_upstream_name_outside_the_fence():
    """In the package and in ``bench/``."""
    from haepo_ray.upstream import internals

    env_variables = frozenset(i.name for i in internals() if i.kind == "env")
    outside = {}
    for path in checked_files():
        if FENCE in path.parents:
            continue
        uses = private_uses(path, own_modules(path), env_variables)
        if uses:
            outside[str(path.relative_to(ROOT))] = uses
    assert outside == {}


def test_the_fence_declares_every_private_name_it_uses():
    """The fence's lists (``INTERNALS`` of each module) are the fence's code: each private name a
    fence module uses is declared, and each declared private name is used (a private module's
    names count under the module's, e.g. ``ray.train._internal.storage``); so is each internal
    module it imports (or a submodule it imports from it: ``from trl.kernels import chunked_logprob``)."""
    from haepo_ray.upstream import internals

    declared = {i.name for i in internals() if is_private(i.name) or i.kind == "env"}
    declared_modules = {i.owner.partition(":")[0] for i in internals()}
    env_variables = frozenset(i.name for i in internals() if i.kind == "env")
    used, modules = set(), set()
    for path in sorted(FENCE.glob("*.py")):
        for _, name, how in private_uses(path, ("haepo_ray",), env_variables):
            if how == "import":
                modules.add(name)
            elif how != "patches an upstream library":
                used.add(name)
    assert used - declared == set(), "used in the fence, not declared in INTERNALS"
    assert declared - used == set(), "declared in INTERNALS, used nowhere in the fence"
    undeclared = {m for m in modules if not any(d == m or d.startswith(f"{m}.") for d in declared_modules)}
    assert undeclared == set(), "internal modules imported, none of whose names (or submodules) is declared"


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
