"""Which algorithm, env and config made an RLlib algorithm checkpoint, read without building
anything: ``haepo train --restore`` goes on with that config, and refuses to restore into
another algorithm, which fails with an optimizer's error or, where the modules match (HAEPO,
GRPO and DPO share theirs), loads one algorithm's weights into another's without a word."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_LEARNER_GROUP
from ray.rllib.utils.checkpoints import get_checkpoint_info

METADATA_FILE = "rllib_checkpoint.json"  # what an RLlib checkpoint folder holds first (get_checkpoint_info)
# Where the weights and optimiser are: RLlib's restore skips a component whose folder is missing.
LEARNER = Path(COMPONENT_LEARNER_GROUP, COMPONENT_LEARNER)


@dataclass(frozen=True)
class CheckpointOrigin:
    """What made a checkpoint: the Algorithm class, the env id (None: an env given as a class or
    left unset) and the AlgorithmConfig it was built from."""

    algorithm: type
    env: str | None
    config: AlgorithmConfig


def checkpoint_origin(path: str | Path) -> CheckpointOrigin:
    """The origin of the RLlib algorithm checkpoint in folder ``path`` (one of ``haepo train``,
    or of a sweep's trial); raises ValueError saying what ``path`` is instead."""
    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"{path}: no such folder")
    if not (folder / METADATA_FILE).is_file():
        raise ValueError(f"{path} is not an RLlib checkpoint (no {METADATA_FILE}): give the "
                         "folder haepo train printed, or a sweep trial's checkpoint_NNNNNN")
    try:
        info = get_checkpoint_info(folder)
    except (OSError, ValueError, KeyError) as err:  # a damaged rllib_checkpoint.json, a state file missing
        raise ValueError(f"{path} is not a whole RLlib checkpoint ({type(err).__name__}: {err})") from None
    if info["type"] != "Algorithm":
        raise ValueError(f"{path} is a checkpoint of an RLlib {info['type']}, not of an algorithm")
    if not info.get("class_and_ctor_args_file"):
        raise ValueError(f"{path} is a checkpoint of RLlib's old API stack (version {info['checkpoint_version']}), "
                         "which haepo-ray's algorithms cannot restore")
    if not (folder / LEARNER).is_dir():
        raise ValueError(f"{path} is not a whole RLlib checkpoint: it has no {LEARNER.as_posix()}/ (the weights and "
                         "optimiser), and restoring would go on from new ones without a word")
    try:
        with open(folder / info["class_and_ctor_args_file"], "rb") as f:
            made_by = pickle.load(f)  # as trusted as the restore, which unpickles the state beside it
        config = made_by["ctor_args_and_kwargs"][0][0]
    except Exception as err:  # noqa: BLE001 - a damaged pickle raises almost any type
        raise ValueError(f"{path} is not a whole RLlib checkpoint: its {info['class_and_ctor_args_file']} cannot "
                         f"be read ({type(err).__name__}: {err})") from None
    if isinstance(config, dict):  # the config's get_state(), as RLlib saves it
        config = AlgorithmConfig.from_state(config)
    return CheckpointOrigin(made_by["class"], config.env if isinstance(config.env, str) else None, config)
