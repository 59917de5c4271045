"""A thread-safe least-recently-used cache bounded by the weight of what it keeps.

Batches read the same few dozen files' key mirrors and deletion vectors again; keeping them
saves decoding them again, and the bound keeps the driver's memory what it was configured
to be.  Entries go oldest first once their weights pass the limit (the newest always stays).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Bounded(Generic[K, V]):
    """Up to ``limit`` of weight (each entry's ``weight(key, value)``; 1 by default)."""

    def __init__(self, limit: int, weight: Callable[[K, V], int] | None = None):
        self.limit = limit
        self._weight = weight or (lambda key, value: 1)
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The value kept for ``key`` (now the most recently used), or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: K, value: V) -> None:
        """Keeps ``value`` for ``key``, dropping the least recently used past the limit."""
        weight = self._weight(key, value)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._held -= old[1]
            self._entries[key] = (value, weight)
            self._held += weight
            while self._held > self.limit and len(self._entries) > 1:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._held -= dropped

    def values(self) -> list[V]:
        """The kept values, least recently used first."""
        with self._lock:
            return [value for value, _ in self._entries.values()]
