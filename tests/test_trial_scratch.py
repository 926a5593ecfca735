"""A trial's scratch folder on its node (haepo_ray.sweep.trial_scratch): gone when it ends, and,
when its process is killed, removed by the next one made there; never while its process lives."""

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from haepo_ray.sweep.trial_scratch import LOCK_SUFFIX, remove_orphans, scratch_folder

PREFIX = "haepo-test-"
# A process that holds a scratch folder (a checkpoint in it) until it is killed.
HOLDER = """
import sys, time
from haepo_ray.sweep.trial_scratch import scratch_folder
with scratch_folder(sys.argv[1]) as folder:
    (folder / "checkpoint").mkdir()
    (folder / "checkpoint" / "model.safetensors").write_bytes(bytes(4096))
    print(folder, flush=True)
    time.sleep(600)
"""


@pytest.fixture
def node_tmp(tmp_path, monkeypatch):
    """The temporary directory of this process and of those it starts."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir reads TMPDIR again
    return folder


@pytest.fixture
def holders():
    """Starts holders of scratch folders (:data:`HOLDER`); kills those left at the end."""
    started = []

    def start(prefix: str = PREFIX) -> tuple[subprocess.Popen, Path]:
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, prefix], stdout=subprocess.PIPE, text=True)
        started.append(proc)
        folder = Path(proc.stdout.readline().strip())
        assert folder.is_dir(), f"the holder printed no folder (exit {proc.poll()})"
        return proc, folder

    yield start
    for proc in started:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def kill(proc: subprocess.Popen) -> None:
    proc.kill()  # SIGKILL: no finally runs
    proc.wait()


def test_the_folder_and_its_lock_are_removed_when_it_ends_and_when_its_work_raises(node_tmp):
    with scratch_folder(PREFIX) as folder:
        assert folder.parent == node_tmp and folder.name.startswith(PREFIX) and folder.is_dir()
        assert Path(f"{folder}{LOCK_SUFFIX}").is_file()
        (folder / "run").mkdir()
        (folder / "run" / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(RuntimeError, match="update failed"), scratch_folder(PREFIX) as raised:
        raise RuntimeError("update failed")
    assert not folder.exists() and not raised.exists()
    assert list(node_tmp.iterdir()) == []


def test_a_killed_process_folder_is_removed_by_the_next_one_and_a_living_process_folder_is_kept(
        node_tmp, holders):
    (killed, left), (living, kept) = holders(), holders()
    other_prefix = holders("haepo-other-")
    old = node_tmp / f"{PREFIX}without-lock"  # an older version's folder, or not a scratch folder
    old.mkdir()
    kill(killed)
    kill(other_prefix[0])
    assert left.is_dir(), "the kernel removed nothing: this test would prove nothing"

    with scratch_folder(PREFIX) as mine:
        assert not left.exists() and not Path(f"{left}{LOCK_SUFFIX}").exists()
        assert (kept / "checkpoint" / "model.safetensors").stat().st_size == 4096
    assert not mine.exists() and kept.is_dir()
    assert other_prefix[1].is_dir() and old.is_dir()

    assert remove_orphans(PREFIX, node_tmp) == []  # the living one's lock is held
    kill(living)
    assert remove_orphans(PREFIX, node_tmp) == [kept]
    assert not kept.exists() and not Path(f"{kept}{LOCK_SUFFIX}").exists()
    assert sorted(p.name for p in node_tmp.iterdir()) == sorted(
        [old.name, other_prefix[1].name, other_prefix[1].name + LOCK_SUFFIX])


def test_a_process_killed_after_the_others_scans_leaves_its_folder_to_the_next_scan_at_an_end(node_tmp, holders):
    """A scan at each end, not only at each start: a long trial that began before the kill removes
    the folder when it ends, and when its work raises."""
    with scratch_folder(PREFIX):
        proc, folder = holders()
        kill(proc)
        assert folder.is_dir()
    assert not folder.exists()
    with pytest.raises(RuntimeError), scratch_folder(PREFIX):
        proc, folder = holders()
        kill(proc)
        raise RuntimeError("update failed")
    assert not folder.exists()
    assert list(node_tmp.iterdir()) == []
