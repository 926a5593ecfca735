"""One SFT start per (model, data and its split, SFT settings, seed), shared by a sweep's trials.

Every method of a sweep begins RL from the same SFT checkpoint. Each trial running its own SFT
gives that only where the kernels are deterministic, and pays the SFT once per trial; here the
first trial that needs a start makes it and every other trial with the same :func:`start_key`
(any algorithm or RL setting) loads it (:func:`begin_rl`).

A start's key is the sha256 of the canonical JSON of :func:`key_fields`: what determines the
SFT result (model, data, the held-out split, the SFT steps, learning rate, batch, prompt
length, dtype, device type, LoRA where ``lora_r > 0``, precision where ``mixed``, ACLSum's aspect
where not ``all``, rounding where ``stochastic``, seed), not the
algorithm or RL settings. ``gradient_checkpointing``, ``micro_batch_size``, ``logits`` and
``adamw`` are left out: SFT's step recomputes the same forward, takes the whole batch, and
gets the same log-probs and update. A sweep's trials share one worker count, which is not
in the key either.

A folder of starts (a sweep's ``<experiment folder>/sft_starts``) holds:

- ``<key>/``: a complete start, :meth:`~haepo_ray.llm.train.LLMRun.save_sft`'s files (with
  ``eval_start``, the start's held-out evaluation, evaluated once per start and taken by every
  trial whose :func:`evaluation_fields` agree) and
  ``start.json`` (the key and its fields), written last: a folder without it is not a start.
- ``<key>.lock``: locked (``fcntl.flock``, also on NFS) by rank 0 of the trial that looks
  for the start and, finding none, makes it; a second trial asking meanwhile waits, then loads.
  The kernel releases the lock of a killed process.
- ``<key>.partial/``: where the maker writes before the atomic rename (``os.replace``) to
  ``<key>/``; one that a killed maker left is removed by the next maker.

Every worker of a trial loads from the folder, so trials on several nodes need it on storage
they all mount (as Ray's ``storage_path`` must be). The workers of a trial whose rank 0 waits
on the lock wait in a collective: a concurrent maker's SFT must end within the process group's
timeout.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from haepo_ray.llm.settings import LLMTrainSettings
    from haepo_ray.llm.train import LLMRun

__all__ = ["LOADED", "MADE", "MARKER", "OWN", "begin_rl", "evaluation_fields", "is_complete", "key_fields",
           "start_key"]

MARKER = "start.json"
OWN, MADE, LOADED = "own", "made", "loaded"  # what begin_rl did: SFT without a folder, SFT saved, a start loaded

_SFT_FIELDS = ("model", "data", "eval_prompts", "split_seed", "sft_examples", "sft_batch", "sft_lr",
               "max_source_words", "dtype", "lora_r", "seed")
_LORA_FIELDS = ("lora_alpha", "lora_target_modules")  # only where lora_r > 0


def key_fields(settings: LLMTrainSettings) -> dict[str, Any]:
    """The settings that determine a run's SFT result (module docstring), as JSON values."""
    names = _SFT_FIELDS + (_LORA_FIELDS if settings.lora_r > 0 else ()) + (
        ("precision",) if settings.precision != "pure" else ()) + (("aspect",) if settings.aspect != "all" else ()) + (
        ("rounding",) if settings.rounding != "nearest" else ())
    fields = {name: getattr(settings, name) for name in names}
    fields["device"] = settings.device.split(":")[0]  # the kernels' kind, not the card
    return json.loads(json.dumps(fields))  # tuples as lists


# What a start's held-out evaluation depends on besides the start (haepo_ray.llm.evaluate): a run
# takes a shared start's evaluation as its own only where these agree (LLMRun.load_sft).
_EVAL_FIELDS = ("eval_batch", "eval_samples", "kl_samples", "max_new_tokens", "min_new_tokens", "temperature",
                "decoding", "reward_weights", "reference", "logits")


def evaluation_fields(settings: LLMTrainSettings) -> dict[str, Any]:
    """:func:`key_fields` and the evaluation's own settings, as JSON values."""
    return json.loads(json.dumps({**key_fields(settings), **{n: getattr(settings, n) for n in _EVAL_FIELDS}}))


def start_key(settings: LLMTrainSettings) -> str:
    """sha256 of the canonical JSON of :func:`key_fields`."""
    text = json.dumps(key_fields(settings), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def is_complete(folder: Path) -> bool:
    """``folder`` is a start: its marker, written last, is there."""
    return (folder / MARKER).is_file()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _load(run: LLMRun, folder: Path) -> None:
    marker = json.loads((folder / MARKER).read_text())
    if marker["fields"] != key_fields(run.settings):
        raise ValueError(f"{folder}: a start of {marker['fields']}, not of this run's {key_fields(run.settings)}")
    run.load_sft(folder)


def _make(run: LLMRun, folder: Path) -> None:
    """Write ``run``'s start to ``folder`` (rank 0, holding its lock) through ``<key>.partial``."""
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # a killed maker's
    run.save_sft(partial)
    (partial / MARKER).write_text(json.dumps({"key": folder.name, "fields": key_fields(run.settings)}, indent=2))
    if folder.exists():  # without its marker: not a start
        shutil.rmtree(folder)
    os.replace(partial, folder)


def begin_rl(run: LLMRun, starts: str | Path | None) -> str:
    """Bring ``run`` (every worker) to its first RL update: load the start of its
    :func:`start_key` from the folder ``starts`` (:data:`LOADED`), or run SFT and save it there
    for the others (:data:`MADE`); with no folder, run SFT (:data:`OWN`)."""
    if starts is None:
        run.sft()
        return OWN
    folder = Path(starts) / start_key(run.settings)
    with contextlib.ExitStack() as held:
        found = 0.0
        if run.world.is_main:
            folder.parent.mkdir(parents=True, exist_ok=True)
            held.enter_context(_locked(folder.with_name(folder.name + ".lock")))
            found = float(is_complete(folder))
        found, = run.world.sum([found], run.settings.device)  # rank 0's answer, to every worker
        if found:
            _load(run, folder)
            return LOADED
        run.sft()
        if run.world.is_main:
            _make(run, folder)
        return MADE
