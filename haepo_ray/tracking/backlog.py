"""The MLflow writer's backlog: messages not written yet, in order, in memory up to a bound and
in a file beyond it, so that a long tracking-server outage costs bounded memory and loses
nothing.

The head of the line is in memory, the tail in the file: a message goes to the file while the
memory part is full or the file holds messages not read back yet, and the file is read back
(in order, a memory's worth at a time) once the memory part is empty. Objects that cannot be
pickled, the events a ``flush`` waits on, stay in memory and the file refers to them.

The file is the writer's scratch space, not a record: it is removed when drained or closed.
A driver killed during an outage leaves it behind; a resumed sweep does not read it (it
recovers what was not written from the trials' ``result.json``) and replaces it.
"""

from __future__ import annotations

import io
import os
import pickle
import tempfile
import threading
from collections import deque
from collections.abc import Iterable
from typing import Any

DEFAULT_MAX_IN_MEMORY = 10_000


class Backlog:
    """A first-in first-out line of messages, spilled to ``path`` past ``max_in_memory``.

    Args:
        path: the spill file (created when first needed, removed when drained); None: an
            anonymous temporary file.
        max_in_memory: messages held in memory before the next ones go to the file.

    Not thread-safe: one thread (the writer's) uses it; :func:`len` may be read from others.
    """

    def __init__(self, path: str | None = None, max_in_memory: int = DEFAULT_MAX_IN_MEMORY):
        if max_in_memory < 1:
            raise ValueError(f"Backlog.max_in_memory must be >= 1, got {max_in_memory}")
        self.path = path
        self.max_in_memory = max_in_memory
        self.spilled_total = 0  # messages that went through the file, over the backlog's life
        self._memory: deque[Any] = deque()
        self._file: io.BufferedRandom | None = None
        self._read_at = 0
        self._in_file = 0
        self._local: dict[int, Any] = {}  # unpicklable objects the file refers to, by id
        if path is not None and os.path.exists(path):
            os.remove(path)  # a killed driver's leftover

    def __len__(self) -> int:
        return len(self._memory) + self._in_file

    @property
    def in_file(self) -> int:
        """Messages in the file, not read back yet."""
        return self._in_file

    def append(self, message: Any) -> None:
        if self._in_file or len(self._memory) >= self.max_in_memory:
            self._spill(message)
        else:
            self._memory.append(message)

    def put_back(self, messages: Iterable[Any]) -> None:
        """Puts ``messages`` back at the head, in their order (in memory, past the bound)."""
        self._memory.extendleft(reversed(list(messages)))

    def popleft(self) -> Any:
        """The first message; ``IndexError`` when there is none."""
        if not self._memory and self._in_file:
            self._read_back()
        return self._memory.popleft()

    def peek(self) -> Any:
        """The first message, left in place; ``IndexError`` when there is none."""
        if not self._memory and self._in_file:
            self._read_back()
        return self._memory[0]

    def close(self) -> None:
        """Drops what is left and removes the file."""
        self._memory.clear()
        self._local.clear()
        self._in_file = 0
        self._drop_file()

    # ------------------------------------------------------------------ the file

    def _spill(self, message: Any) -> None:
        if self._file is None:
            if self.path is None:
                self._file = tempfile.TemporaryFile(prefix="haepo-mlflow-backlog-")
            else:
                os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
                self._file = open(self.path, "w+b")  # noqa: SIM115 - kept open until drained
        self._file.seek(0, io.SEEK_END)
        pickler = pickle.Pickler(self._file, protocol=pickle.HIGHEST_PROTOCOL)
        pickler.persistent_id = self._keep_local
        pickler.dump(message)
        self._in_file += 1
        self.spilled_total += 1

    def _read_back(self) -> None:
        assert self._file is not None
        self._file.flush()
        self._file.seek(self._read_at)
        while self._in_file and len(self._memory) < self.max_in_memory:
            # One unpickler per message, as one pickler wrote each: an unpickler's memo
            # outlives load(), and the next message's back-references (an object it holds
            # twice, e.g. a trial id that is also a tag) would resolve into the previous one.
            unpickler = pickle.Unpickler(self._file)
            unpickler.persistent_load = self._local.pop
            self._memory.append(unpickler.load())
            self._in_file -= 1
        self._read_at = self._file.tell()
        if not self._in_file:
            self._drop_file()

    def _keep_local(self, obj: Any) -> int | None:
        if isinstance(obj, _UNPICKLABLE):
            self._local[id(obj)] = obj
            return id(obj)
        return None

    def _drop_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
            if self.path is not None and os.path.exists(self.path):
                os.remove(self.path)
        self._read_at = 0


_UNPICKLABLE = (type(threading.Event()), type(threading.Lock()))
