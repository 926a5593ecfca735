"""Helpers for cluster/local/start.sh (standard library only).

    python lib.py free-ports N                 N free TCP ports on 127.0.0.1, one per line
    python lib.py port-range SIZE              "LOW HIGH": SIZE consecutive free ports
    python lib.py wait-dashboard URL TOKENFILE SECONDS
                                               until the Ray dashboard answers /api/version
    python lib.py wait-nodes URL TOKENFILE N SECONDS
                                               until N Ray nodes are ALIVE
    python lib.py wait-http URL SECONDS        until URL answers HTTP 200 (the MLflow server)
    python lib.py new-token                    a fresh random token (what `ray get-auth-token
                                               --generate` would write), 256 bits, hex

Ports are only probed here, then handed to `ray start` and `mlflow server`; another process
may take one in between (rare; start.sh then fails and says which log to read).
"""

from __future__ import annotations

import json
import random
import secrets
import socket
import sys
import time
import urllib.error
import urllib.request

HOST = "127.0.0.1"


def _is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def free_ports(n: int) -> list[int]:
    """n distinct free ports, outside the range Ray hands to its workers by default
    (10002-19999), so that they cannot collide with other Ray instances on this machine."""
    chosen: list[int] = []
    rng = random.Random()
    while len(chosen) < n:
        port = rng.randrange(20000, 30000)
        if port not in chosen and _is_free(port):
            chosen.append(port)
    return chosen


def port_range(size: int) -> tuple[int, int]:
    """``size`` consecutive free ports in 30000-45000 (worker ports of one node)."""
    rng = random.Random()
    for _ in range(1000):
        low = rng.randrange(30000, 45000 - size)
        if all(_is_free(p) for p in range(low, low + size)):
            return low, low + size - 1
    raise SystemExit(f"no {size} consecutive free ports in 30000-45000")


def _get(url: str, token_file: str | None, timeout: float = 5.0) -> tuple[int, bytes]:
    headers = {}
    if token_file:
        with open(token_file) as fh:
            headers["Authorization"] = f"Bearer {fh.read().strip()}"
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (loopback URL)
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _wait(what: str, seconds: float, probe) -> None:
    deadline = time.monotonic() + seconds
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            done, last = probe()
            if done:
                return
        except (OSError, ValueError) as err:
            last = f"{type(err).__name__}: {err}"
        time.sleep(0.5)
    raise SystemExit(f"timed out after {seconds:.0f} s waiting for {what} ({last})")


def wait_dashboard(url: str, token_file: str, seconds: float) -> None:
    def probe():
        code, body = _get(f"{url}/api/version", token_file)
        return code == 200, f"HTTP {code} {body[:200]!r}"

    _wait(f"the Ray dashboard at {url}", seconds, probe)


def alive_nodes(url: str, token_file: str) -> list[dict]:
    code, body = _get(f"{url}/api/v0/nodes?limit=1000&detail=false", token_file, timeout=10.0)
    if code != 200:
        raise ValueError(f"HTTP {code} {body[:200]!r}")
    rows = json.loads(body)["data"]["result"]["result"]
    return [r for r in rows if r.get("state") == "ALIVE"]


def wait_nodes(url: str, token_file: str, n: int, seconds: float) -> None:
    def probe():
        nodes = alive_nodes(url, token_file)
        return len(nodes) >= n, f"{len(nodes)} of {n} nodes alive"

    _wait(f"{n} Ray nodes", seconds, probe)


def wait_http(url: str, seconds: float) -> None:
    def probe():
        code, body = _get(url, None)
        return code == 200, f"HTTP {code}"

    _wait(url, seconds, probe)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, args = argv[0], argv[1:]
    if cmd == "free-ports":
        print("\n".join(str(p) for p in free_ports(int(args[0]))))
    elif cmd == "port-range":
        print(*port_range(int(args[0])))
    elif cmd == "wait-dashboard":
        wait_dashboard(args[0], args[1], float(args[2]))
    elif cmd == "wait-nodes":
        wait_nodes(args[0], args[1], int(args[2]), float(args[3]))
    elif cmd == "wait-http":
        wait_http(args[0], float(args[1]))
    elif cmd == "new-token":
        print(secrets.token_hex(32))
    else:
        print(f"unknown command {cmd!r}\n{__doc__}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
