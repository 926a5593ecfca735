"""The MLflow writer's backlog (:mod:`haepo_ray.tracking.backlog`): order across memory and
file, each message given back as it was queued."""

from __future__ import annotations

import pytest

from haepo_ray import names, tracking


def test_the_backlog_keeps_order_across_memory_and_file(tmp_path):
    from haepo_ray.tracking.backlog import Backlog

    path = tmp_path / "backlog.pkl"
    backlog = Backlog(str(path), max_in_memory=3)
    barrier = tracking.writer.Barrier()
    for item in [1, 2, 3, 4, barrier, 5]:
        backlog.append(item)
    assert len(backlog) == 6 and backlog.in_file == 3 and path.exists()
    assert backlog.popleft() == 1
    backlog.put_back([0, 1])
    backlog.append(6)  # the file still holds messages: behind them
    out = [backlog.popleft() for _ in range(len(backlog))]
    assert out[:5] == [0, 1, 2, 3, 4] and out[6:] == [5, 6]
    assert out[5].done is barrier.done  # the event a flush waits on, not a copy
    assert len(backlog) == 0 and not path.exists() and backlog.spilled_total == 4
    with pytest.raises(IndexError):
        backlog.popleft()
    with pytest.raises(ValueError, match="max_in_memory must be >= 1"):
        Backlog(None, 0)


def test_the_backlog_gives_back_each_message_as_it_was_queued(tmp_path):
    """Messages that hold one object twice (a StartRun's trial id is also its tag) come back
    from the file equal, several read back at a time (10,000 one-iteration trials once came
    back with other trials' ids in their tags)."""
    from haepo_ray.tracking.backlog import Backlog

    messages = []
    for i in range(12):
        trial_id = f"trial_{i:05d}"
        messages.append(tracking.writer.StartRun(trial_id, f"trial {i}", {names.TRIAL_ID: trial_id}, {"lr": str(i)}))
        messages.append(tracking.writer.Tags(trial_id, {names.NUM_FAILURES: "0", names.ERROR: trial_id}))
    backlog = Backlog(str(tmp_path / "backlog.pkl"), max_in_memory=4)
    for message in messages:
        backlog.append(message)
    assert backlog.in_file == len(messages) - 4
    assert [backlog.popleft() for _ in range(len(messages))] == messages
