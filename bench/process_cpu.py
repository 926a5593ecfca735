"""Where a command's CPU goes, by kind of Python process: Ray actors by class, Ray's daemons,
MLflow servers, pytest's workers, `haepo` sub-commands.

    python bench/process_cpu.py OUT.json -- make test

Runs the command with a ``sitecustomize`` module first on ``PYTHONPATH``. Every Python process
the command starts imports it, Ray's workers and daemons included (they inherit the
environment), and it writes the process's CPU seconds and title to a file of its own every
half second, from a thread that a test's patched ``time.sleep`` does not reach, and once more
at a normal exit: each sample whole (written aside, then renamed), the exit's last (not
overwritten by an older one the thread took before it). At the end the script prints the CPU-s
by kind beside the machine's busy CPU-s over the run (``/proc/stat``) and writes both to
OUT.json. Processes that are not Python (Ray's raylet and GCS, PostgreSQL, Chromium,
Prometheus) or not started afresh (forked) are in the machine's figure only; a process killed
(or ended by ``os._exit``) loses at most its last half second. A ``sitecustomize`` of the
interpreter's own is shadowed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

PROBE = '''
import atexit, os, sys, threading
from time import sleep as _sleep

_PATH = os.path.join(os.environ["PROCESS_CPU_DIR"], str(os.getpid()))
_ARGV = " ".join(" ".join(sys.argv).split())[:300]
_PID = os.getpid()  # a forked child inherits the exit hook, not the thread: it writes nothing
_LOCK = threading.Lock()
_ENDED = []  # the exit's sample is written: the thread's later ones (older numbers) are not

def _sample(final=False):
    if os.getpid() != _PID:
        return
    with _LOCK:
        if _ENDED:
            return
        if final:
            _ENDED.append(True)
        try:
            with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
                title = " ".join(f.read().replace(b"\\0", b" ").decode(errors="replace").split())[:300]
            t = os.times()
            with open(_PATH + ".tmp", "w") as f:
                f.write(f"{t.user + t.system:.2f}\\t{title}\\t{_ARGV}\\n")
            os.replace(_PATH + ".tmp", _PATH)  # whole, even if the process is killed mid-write
        except Exception:
            pass

def _probe():
    while True:
        _sample()
        _sleep(0.5)

atexit.register(_sample, True)
threading.Thread(target=_probe, name="process_cpu", daemon=True).start()
'''

# (kind, pattern on "title<TAB>argv"), first match wins; a Ray actor's kind is its class.
KINDS = [
    ("Ray idle worker", r"^ray::IDLE"),
    ("Ray actor {0}", r"^ray::(\w+)"),
    ("MLflow server", r"mlflow(\.server|/server| server)|uvicorn|gunicorn"),
    ("Ray daemons", r"ray/(dashboard|_private/log_monitor|autoscaler|_private/runtime_env)"),
    ("ray start", r"bin/ray start"),
    ("pytest and its workers", r"-m pytest|pytest/__main__|exec\(eval\(sys\.stdin\.readline"),
    ("haepo {0}", r"-m\s+haepo_ray\.cli\s+(\w+)|bin/haepo\s+(\w+)"),
    ("python -c (a test's own subprocess)", r"python[\d.]*\s+(?:-u\s+)?-c\s"),
]


def kind(title: str, argv: str) -> str:
    line = f"{title}\t{argv}"
    for name, pattern in KINDS:
        match = re.search(pattern, line)
        if match:
            return name.format(next((g for g in match.groups() if g), ""))
    return "other: " + (title.split() or ["?"])[0].rsplit("/", 1)[-1][:40]


def busy_seconds() -> float:
    """CPU-seconds this machine has spent busy (all processes) since boot (guest time is
    already in user and nice)."""
    with open("/proc/stat") as f:
        user, nice, system, idle, iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="JSON file for the table")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    with tempfile.TemporaryDirectory(prefix="process_cpu-") as tmp:
        probe_dir, samples = Path(tmp, "probe"), Path(tmp, "samples")
        probe_dir.mkdir()
        samples.mkdir()
        (probe_dir / "sitecustomize.py").write_text(PROBE)
        env = {**os.environ, "PROCESS_CPU_DIR": str(samples),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(probe_dir), os.environ.get("PYTHONPATH")]))}
        busy, start = busy_seconds(), time.monotonic()
        code = subprocess.call(command, env=env)
        busy, wall = busy_seconds() - busy, time.monotonic() - start
        by_kind: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        for sample in samples.iterdir():
            if sample.suffix == ".tmp":  # a process killed while it wrote: its last whole sample is beside it
                continue
            fields = sample.read_text().rstrip("\n").split("\t")
            if len(fields) == 3:
                row = by_kind[kind(fields[1], fields[2])]
                row[0] += 1
                row[1] += float(fields[0])
    rows = sorted(({"kind": k, "processes": n, "cpu_s": round(c, 1)} for k, (n, c) in by_kind.items()),
                  key=lambda r: -r["cpu_s"])
    python = sum(r["cpu_s"] for r in rows)
    print(f"\n{' '.join(command)}: exit {code}, {wall:.0f} s, the machine busy {busy:.0f} CPU-s "
          f"({python:.0f} in Python processes)")
    print(f"{'CPU-s':>8} {'procs':>6}  kind")
    for r in rows:
        print(f"{r['cpu_s']:8.1f} {r['processes']:6d}  {r['kind']}")
    args.out.write_text(json.dumps({"command": command, "exit": code, "wall_s": round(wall, 1),
                                    "machine_busy_cpu_s": round(busy, 1), "kinds": rows}, indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main())
