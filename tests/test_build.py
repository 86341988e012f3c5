"""``turnkeep.worker.build``'s process set-up for long-running workers."""

from __future__ import annotations

import gc

from turnkeep.worker.build import (
    YOUNG_GENERATION_THRESHOLD,
    freeze_startup_heap,
    tune_garbage_collector,
)


def test_the_startup_heap_leaves_the_garbage_collectors_scans() -> None:
    alive = [[index] for index in range(1000)]  # containers, which the collector tracks
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() >= len(alive)
        # What a collection walks (every generation but the permanent one) no longer has them.
        scanned = {id(obj) for obj in gc.get_objects()}
        assert id(alive) not in scanned
        assert not any(id(item) in scanned for item in alive)
        # A cycle made afterwards is still collected.
        cycle: list[object] = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1
    finally:
        gc.unfreeze()


def test_a_serving_process_collects_its_youngest_generation_less_often() -> None:
    before = gc.get_threshold()
    try:
        tune_garbage_collector()
        assert gc.get_threshold() == (YOUNG_GENERATION_THRESHOLD, *before[1:])
        assert gc.get_freeze_count() > 0
        assert gc.isenabled()
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
