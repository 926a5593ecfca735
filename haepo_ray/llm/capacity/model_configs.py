"""A model's architecture (a transformers config, no weights) from its name, offline.

- ``"tiny"``: the tiny test model's (:func:`tiny_config`);
- ``"random:NAME"`` (:func:`haepo_ray.llm.models.random_model`): that of ``NAME``;
- a name of :data:`BUNDLED` (the paper's two models, their instruct variants and SmolLM2), or
  its Hugging Face Hub name: a config file shipped in ``configs/`` (its README says where each
  file's numbers come from);
- a local folder with a ``config.json``, or any other Hub name (from the local Hugging Face
  cache when ``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["BUNDLED", "model_config", "tiny_config"]

_FOLDER = Path(__file__).with_name("configs")
BUNDLED: tuple[str, ...] = tuple(sorted(p.stem for p in _FOLDER.glob("*.json")))
_HUB_NAMES = {  # a trial's ``model`` may be the Hub name of a bundled config
    "Qwen/Qwen2.5-0.5B": "qwen2.5-0.5b",
    "Qwen/Qwen2.5-1.5B": "qwen2.5-1.5b",
    "Qwen/Qwen2.5-1.5B-Instruct": "qwen2.5-1.5b-instruct",
    "meta-llama/Llama-3.2-1B": "llama-3.2-1b",
    "meta-llama/Llama-3.2-1B-Instruct": "llama-3.2-1b-instruct",
    "HuggingFaceTB/SmolLM2-135M-Instruct": "smollm2",
}


def _bundled(name: str) -> Any:
    from transformers import AutoConfig

    values = json.loads((_FOLDER / f"{name}.json").read_text())
    return AutoConfig.for_model(values.pop("model_type"), **values)


def tiny_config(vocab_size: int = 512, hidden_size: int = 64, **token_ids: int) -> Any:
    """The tiny model's architecture: a 2-layer Llama, 4 heads, tied embeddings."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        max_position_embeddings=2048, tie_word_embeddings=True, **token_ids,
    )


def model_config(name: str) -> Any:
    """The transformers config of model ``name`` (module docstring); ValueError if there is none."""
    if name == "tiny":
        return tiny_config()
    if name.startswith("random:"):  # haepo_ray.llm.models.RANDOM: the architecture, random weights
        return model_config(name.removeprefix("random:"))
    bundled = _HUB_NAMES.get(name, name.lower())
    if bundled in BUNDLED:
        return _bundled(bundled)
    from transformers import AutoConfig

    local = Path(name).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ValueError(f"model {name!r}: the folder has no config.json")
        try:
            return AutoConfig.from_pretrained(local, local_files_only=True)
        except (OSError, ValueError) as err:  # not JSON; a model type transformers does not know
            raise ValueError(f"model {name!r}: its config.json cannot be read ({str(err).splitlines()[0]})") from None
    unknown = f"model {name!r} is unknown: not one of {('tiny', *BUNDLED)}, not a local folder with a config.json"
    if "/" not in name:  # not a Hub repository id ("owner/name")
        raise ValueError(f"{unknown}, not a Hugging Face Hub name (owner/name)")
    offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1"
    try:
        return AutoConfig.from_pretrained(name, local_files_only=offline)
    except (OSError, ValueError) as err:
        raise ValueError(f"{unknown}, and the Hugging Face Hub did not provide its config "
                         f"({str(err).splitlines()[0]})") from None
