"""The trigger behind each landing folder's Asset: a landed file starts a run.

Airflow 3 schedules a DAG on external events through an ``AssetWatcher``: the triggerer runs
an event trigger and every event it yields becomes an asset event, which queues a run of each
DAG scheduled on that asset.  A polling sensor would hold a worker slot per DAG and a
deferrable one would still start as a task on a schedule; a watcher costs one coroutine in the
triggerer, shared by every program that reads the folder (same folder, same trigger), and
reacts within one poll.

The trigger announces files, it does not register them: registration (and its exactly-once
ledger) stays in the ``prepare`` task.  So the trigger may announce a file twice (after a
triggerer restart it announces what the folder holds, so nothing landed while it was down is
missed); a run that finds nothing new ends in seconds without Spark.  A file is announced
once its size and modification time held still for one poll, so a writer that does not land
atomically (``.name.tmp`` then rename) is not read half written.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

#: Files listed per event payload (the rest are counted); payloads are stored in the metadata DB.
PAYLOAD_FILES = 20


def landed_signatures(folder: str | Path) -> dict[str, tuple[int, int]]:
    """The batch files of one landing folder (inserts and ``_deletes``), by name: (size, mtime).

    Uses the landing area's own rules (:func:`incr.runtime.landing.discover`, or its object
    store listing for a URI), so the trigger and ``prepare`` agree on what a batch file is;
    a file of a type incr cannot read is still announced, so the run that rejects it says why.
    """
    from incr.runtime.landing import discover
    from incr.runtime.remote import RemoteLanding, is_remote

    if is_remote(folder):
        root, table = str(folder).rstrip("/").rsplit("/", 1)
        found = RemoteLanding(root).files([table], check_types=False)
    else:
        found = discover(Path(folder).parent, [Path(folder).name], check_types=False)
    return {f.relpath: (f.size, f.mtime_ns) for f in found}


class Announcer:
    """Which files to announce, listing after listing: those that held still and are new.

    A file is new until announced with its present signature; one that changes after being
    announced (rewritten in place) is announced again, and one that went away is forgotten,
    so landing it again is announced.
    """

    def __init__(self) -> None:
        self.announced: dict[str, tuple[int, int]] = {}
        self.previous: dict[str, tuple[int, int]] | None = None

    def step(self, current: dict[str, tuple[int, int]]) -> list[str]:
        """The files of ``current`` (one listing) to announce now, sorted."""
        settled: dict[str, tuple[int, int]] = {}
        if self.previous is not None:
            settled = {name: sig for name, sig in current.items()
                       if self.previous.get(name) == sig and self.announced.get(name) != sig}
        self.announced.update(settled)
        self.announced = {name: sig for name, sig in self.announced.items() if name in current}
        self.previous = current
        return sorted(settled)


class LandedFilesTrigger(BaseEventTrigger):
    """Yields an event whenever settled batch files appear (or change) in one landing folder.

    Args:
        folder: the landing folder of one source table (``LANDING/<table>``), or its URI on
            an object store (``s3://bucket/landing/<table>``).
        poke_interval: seconds between two listings of the folder.
    """

    def __init__(self, folder: str, poke_interval: float = 5.0) -> None:
        super().__init__()
        self.folder = folder
        self.poke_interval = poke_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Classpath and arguments: the same folder gives the same trigger in every DAG."""
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"folder": self.folder, "poke_interval": self.poke_interval})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Lists the folder every ``poke_interval`` seconds; yields for files that settled."""
        announcer = Announcer()
        while True:
            names = announcer.step(await asyncio.to_thread(landed_signatures, self.folder))
            if names:
                self.log.info("incr: %d file(s) landed in %s", len(names), self.folder)
                yield TriggerEvent({"folder": self.folder, "files": names[:PAYLOAD_FILES],
                                    "count": len(names)})
            await asyncio.sleep(self.poke_interval)
