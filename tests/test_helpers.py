"""The tests' own process helpers, where a mistake would leave processes running beside later tests."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest
from helpers import run_tree

# A child that starts a grandchild in its own session (as a sweep's driver, Ray and an
# ``mlflow server`` are started), writes the grandchild's pid to a file, and waits.
PARENT = """
import pathlib, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
pathlib.Path(sys.argv[1]).write_text(str(child.pid))
time.sleep(600)
"""


def test_a_timed_out_run_kills_what_its_child_started_in_another_session(tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        run_tree([sys.executable, "-c", PARENT, str(tmp_path / "pid")], timeout=5)
    grandchild = int((tmp_path / "pid").read_text())
    deadline = time.monotonic() + 10
    while psutil.pid_exists(grandchild) and psutil.Process(grandchild).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"the grandchild {grandchild} still runs"
        time.sleep(0.1)


def test_a_run_that_ends_in_time_is_what_subprocess_run_returns():
    done = run_tree([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
                    timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
