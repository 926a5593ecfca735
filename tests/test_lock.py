"""The locks of the exact versions CI tests (requirements/cpu.txt and gpu.txt, `make lock`).

- the cluster's image and cloud nodes install the GPU lock, then haepo-ray without dependencies;
- the two locks pin the same version of every package they share (torch but for its local
  ``+cpu``), and Ray exactly as pyproject.toml does;
- the locks hold every dependency of pyproject.toml (and the Makefile's LLM assets) within its
  range: `make setup` installs haepo-ray with --no-deps, so a dependency missing from the lock
  would be missing from the environment;
- this environment is the lock: every ``name==version`` of the lock `make setup` installed here
  (requirements/cpu.txt unless the set-up's stamp names another) is the version installed.
"""

from __future__ import annotations

import importlib.metadata
import re
import shlex
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
CPU_LOCK = REPO / "requirements" / "cpu.txt"
GPU_LOCK = REPO / "requirements" / "gpu.txt"
DOCKERFILE = REPO / "cluster" / "docker" / "Dockerfile"
LAUNCHER = REPO / "cluster" / "aws" / "haepo-cluster.yaml"

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def pins(lock: Path) -> dict[str, str]:
    """{canonical name: version} of a lock's ``name==version`` lines (hashes and comments are
    continuation or comment lines)."""
    out: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        m = PIN.match(line)
        if m:
            name = canonicalize_name(m[1])
            assert name not in out, f"{lock.name}: {name} pinned twice"
            out[name] = m[2]
    assert len(out) > 100, f"{lock.name}: only {len(out)} pins; not a lock of this project"
    return out


def _pip_installs(commands: list[str]) -> list[list[str]]:
    """The argv of each ``pip install`` in these shell commands (split at ``&&``, ``;``, ...)."""
    out = []
    for command in commands:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        argv: list[str] = []
        for token in [*lexer, ";"]:
            if token in ("&&", "||", ";", "|"):
                if argv[:2] == ["pip", "install"]:
                    out.append(argv)
                argv = []
            else:
                argv.append(token)
    return out


# --------------------------------------------------------------------------- the cluster


def test_dockerfile_installs_the_gpu_lock_then_haepo_without_dependencies():
    lines = DOCKERFILE.read_text().replace("\\\n", " ").splitlines()
    copies = [shlex.split(ln)[1:] for ln in lines if ln.startswith("COPY ")]
    assert any("requirements/gpu.txt" in c[:-1] for c in copies), "the GPU lock copied into the image"
    installs = _pip_installs([ln[len("RUN "):] for ln in lines if ln.startswith("RUN ")])
    lock_installs = [a for a in installs if "requirements/gpu.txt" in a]
    assert lock_installs and all(a[a.index("requirements/gpu.txt") - 1] == "-r" for a in lock_installs)
    others = [a for a in installs if a not in lock_installs]
    assert others, "haepo-ray itself installed"
    for argv in others:
        assert "--no-deps" in argv, f"every dependency comes from the lock: {shlex.join(argv)}"
    assert installs.index(lock_installs[0]) < installs.index(others[0]), "the lock first"


def test_cloud_nodes_install_the_gpu_lock_then_haepo_without_dependencies():
    installs = _pip_installs(yaml.safe_load(LAUNCHER.read_text())["setup_commands"])
    assert installs[0][-2:] == ["-r", "~/haepo-ray/requirements/gpu.txt"]
    assert installs[1][-2:] == ["--no-deps", "~/haepo-ray"]


# --------------------------------------------------------------------------- the locks


def test_cpu_and_gpu_locks_pin_the_same_versions():
    cpu, gpu = pins(CPU_LOCK), pins(GPU_LOCK)
    assert cpu["torch"].endswith("+cpu"), "the CPU lock has torch's CPU build"
    assert "+" not in gpu["torch"], "the GPU lock has PyPI's (CUDA) torch"
    missing = sorted(set(cpu) - set(gpu))
    assert not missing, f"in the CPU lock only: {missing}"
    # torch: the same release, but for the CPU build's local version label (+cpu).
    same = {name: cpu[name] == gpu[name] for name in cpu}
    same["torch"] = Version(cpu["torch"]).public == gpu["torch"]
    differ = {name: (cpu[name], gpu[name]) for name, ok in same.items() if not ok}
    assert not differ, f"CPU and GPU lock differ (cpu, gpu): {differ}"
    assert cpu["ray"] == gpu["ray"] == "2.60.0"


def _pyproject_requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + [r for extra in ("dev", "llm")
                                      for r in project["optional-dependencies"][extra]]
    return [Requirement(r) for r in reqs]


def test_ray_pinned_exactly_in_pyproject():
    (ray,) = [r for r in _pyproject_requirements() if r.name == "ray"]
    assert str(ray.specifier) == "==2.60.0"


@pytest.mark.parametrize("lock", [CPU_LOCK, GPU_LOCK], ids=lambda p: p.name)
def test_lock_holds_every_dependency_of_pyproject_and_the_assets(lock):
    locked = pins(lock)
    outside = {}
    for req in _pyproject_requirements():
        version = locked.get(canonicalize_name(req.name))
        if version is None or not req.specifier.contains(version, prereleases=True):
            outside[str(req)] = version
    makefile = (REPO / "Makefile").read_text()
    (assets,) = re.findall(r"^LLM_ASSETS\s*:=\s*(.+)$", makefile, re.M)
    for asset in assets.split():
        req = Requirement(asset)
        if locked.get(canonicalize_name(req.name)) != str(req.specifier).removeprefix("=="):
            outside[asset] = locked.get(canonicalize_name(req.name))
    assert not outside, f"{lock.name} out of date (`make lock`): {outside}"


# --------------------------------------------------------------------------- this environment


def installed_lock() -> Path:
    """The lock `make setup` installed here: its stamp names it (requirements/cpu.txt, CI's)."""
    stamp = Path(sys.prefix) / ".installed"
    named = stamp.read_text().strip() if stamp.is_file() else ""
    return REPO / named if named else CPU_LOCK


def test_environment_is_the_lock():
    """A fresh clone's `make setup` installs exactly what CI tested."""
    lock = installed_lock()
    wrong = {}
    for name, version in pins(lock).items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed = None
        if installed is None or Version(installed) != Version(version):
            wrong[name] = (version, installed)
    assert not wrong, f"installed versions other than {lock.relative_to(REPO)}'s (locked, installed): {wrong}"
