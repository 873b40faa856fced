"""The server process tunes the cyclic garbage collector before it serves (cli.collect_less)."""

from __future__ import annotations

import gc

from cyclone_server.cli.main import GC_YOUNG_THRESHOLD, collect_less


def test_the_server_freezes_its_start_up_heap_and_collects_young_objects_less_often() -> None:
    before = gc.get_threshold()
    try:
        collect_less()
        assert gc.get_freeze_count() > 0  # the start-up heap: skipped by every later collection
        assert gc.get_threshold() == (max(before[0], GC_YOUNG_THRESHOLD), before[1], before[2])
        assert gc.isenabled()  # cycles are still collected
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
