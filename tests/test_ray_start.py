"""A SIGTERM while Ray starts its local node: ``start_ray`` ends everything the start had
started (``ray.init`` alone left the raylet's two agents running in 3 of 4 such starts here)."""

from __future__ import annotations

import json
import time

import psutil
import pytest

from helpers import fresh_python

# In a fresh interpreter: a thread sends this process SIGTERM once Ray's raylet has started its
# two agents (ray.init then waits for the raylet to register: the node is not yet Ray's to shut
# down), and the start's session name (in every process of the node's command line) is printed.
SCRIPT = """
import json, os, re, signal, threading, time
import psutil
me, seen = psutil.Process(), {}
def send_sigterm_once_the_raylets_agents_run():
    while True:
        for p in me.children(recursive=True):
            try:
                if p.name() == "raylet" and len(p.children()) >= 2:  # its dashboard and runtime-env agents
                    seen["session"] = re.search(r"session_[0-9_-]+", " ".join(p.cmdline())).group(0)
                    seen["started"] = [c.pid for c in me.children(recursive=True)]
                    os.kill(os.getpid(), signal.SIGTERM)
                    return
            except (psutil.Error, AttributeError):
                pass
        time.sleep(0.01)
threading.Thread(target=send_sigterm_once_the_raylets_agents_run, daemon=True).start()
from haepo_ray.ray_start import start_ray
try:
    start_ray(num_cpus=1, include_dashboard=False, log_to_driver=False)
    seen["ended"] = "started"
except BaseException as err:
    seen["ended"] = f"{type(err).__name__} {getattr(err, 'code', '')}".strip()
print(json.dumps(seen))
"""


def _session_processes(session: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if any(session in part for part in p.info["cmdline"] or ()):
            found.append(p)
    return found


def test_a_sigterm_while_ray_starts_leaves_nothing_running():
    seen = json.loads(fresh_python(SCRIPT)[-1])
    assert seen["ended"] == "Terminated"
    assert len(seen["started"]) >= 4  # the GCS, the raylet and its two agents, at least
    time.sleep(1.0)  # the raylet and GCS end with their parent (Ray's fate sharing)
    left = _session_processes(seen["session"]) + [psutil.Process(pid) for pid in seen["started"]
                                                  if psutil.pid_exists(pid)]
    try:
        assert left == []
    finally:
        for p in left:
            p.kill()
