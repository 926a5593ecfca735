"""What a Tune trial holds that the tracking callback logs: its final checkpoint and, after a
driver crash, its results as Tune wrote them (``result.json``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from haepo_ray import names
from haepo_ray.uris import is_uri


def checkpoint_of(trial) -> Any:
    """Tune's checkpoint of the trial, or the one Ray Train reported last (a Train run inside
    the trial keeps its checkpoints itself and reports their path)."""
    try:
        if trial.checkpoint is not None:
            return trial.checkpoint
        path = (trial.last_result or {}).get(names.CHECKPOINT_PATH)
        if not path:
            return None
        from ray.train import Checkpoint

        return Checkpoint(path, filesystem=trial.storage.storage_filesystem)
    except Exception:  # pragma: no cover - Tune internals
        return None


def results_on_disk(trial) -> list[dict[str, Any]]:
    """The results Tune wrote for ``trial`` (``result.json``: one JSON object per line), from
    whichever of its folders (driver staging, storage) holds the most."""
    best: list[dict[str, Any]] = []
    for attr in ("local_path", "path"):
        try:
            folder = getattr(trial, attr, None)
        except Exception:  # pragma: no cover - Tune internals
            folder = None
        if not folder or is_uri(str(folder)):
            continue
        path = Path(folder) / "result.json"
        if not path.is_file():
            continue
        rows = []
        for line in path.read_text(errors="replace").splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue  # a line cut short by the crash
        if len(rows) > len(best):
            best = rows
    return best
