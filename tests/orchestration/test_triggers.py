"""The landing watcher: an event for files that settled, once each, and none for the rest."""

from __future__ import annotations

import asyncio

from incr.orchestration.triggers import Announcer, LandedFilesTrigger, landed_signatures


def test_signatures_follow_the_landing_rules(tmp_path):
    folder = tmp_path / "e"
    (folder / "_deletes").mkdir(parents=True)
    (folder / "001.csv").write_text("a\n1\n")
    (folder / "_deletes" / "002.csv").write_text("a\n1\n")
    (folder / ".003.csv.tmp").write_text("a\n")  # being written: ignored
    (folder / "notes.txt").write_text("?")  # not a batch type: announced, the run says why
    assert sorted(landed_signatures(folder)) == ["e/001.csv", "e/_deletes/002.csv", "e/notes.txt"]
    assert landed_signatures(tmp_path / "missing") == {}


def test_each_file_is_announced_once_it_held_still():
    a = Announcer()
    assert a.step({"e/old.csv": (4, 1)}) == []  # first listing: nothing has held still yet
    assert a.step({"e/old.csv": (4, 1)}) == ["e/old.csv"]  # there when the watcher started
    assert a.step({"e/old.csv": (4, 1), "e/slow.csv": (2, 2)}) == []
    assert a.step({"e/old.csv": (4, 1), "e/slow.csv": (6, 3)}) == []  # still being written
    assert a.step({"e/old.csv": (4, 1), "e/slow.csv": (6, 3)}) == ["e/slow.csv"]
    assert a.step({"e/old.csv": (4, 1), "e/slow.csv": (6, 3)}) == []  # announced once
    assert a.step({"e/slow.csv": (6, 3)}) == []  # old.csv dropped ...
    assert a.step({"e/slow.csv": (6, 3), "e/old.csv": (4, 1)}) == []
    assert a.step({"e/slow.csv": (6, 3), "e/old.csv": (4, 1)}) == ["e/old.csv"]  # ... and landed again
    assert a.step({"e/slow.csv": (7, 9), "e/old.csv": (4, 1)}) == []
    assert a.step({"e/slow.csv": (7, 9), "e/old.csv": (4, 1)}) == ["e/slow.csv"]  # rewritten in place


def test_the_trigger_yields_an_event_for_a_landed_file(tmp_path):
    folder = tmp_path / "e"
    folder.mkdir()
    trigger = LandedFilesTrigger(str(folder), poke_interval=0.01)

    async def first_event() -> dict:
        runner = trigger.run()
        try:
            task = asyncio.ensure_future(runner.__anext__())
            await asyncio.sleep(0.1)
            assert not task.done()  # an empty folder announces nothing
            (folder / "001.csv").write_text("a\n1\n")
            return (await asyncio.wait_for(task, timeout=10)).payload
        finally:
            await runner.aclose()

    payload = asyncio.run(first_event())
    assert payload == {"folder": str(folder), "files": ["e/001.csv"], "count": 1}


def test_a_trigger_is_the_same_for_every_program_reading_the_folder(tmp_path):
    a = LandedFilesTrigger(str(tmp_path), poke_interval=5.0)
    b = LandedFilesTrigger(str(tmp_path), poke_interval=5.0)
    assert a.serialize() == b.serialize()
    assert a.serialize()[0] == "incr.orchestration.triggers.LandedFilesTrigger"
    assert LandedFilesTrigger.hash(*a.serialize()) == LandedFilesTrigger.hash(*b.serialize())
