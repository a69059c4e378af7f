"""corral.base.heap: what start-up leaves is frozen out of the collector's walks, its garbage freed."""

from __future__ import annotations

import gc
import weakref

from corral.base.heap import freeze_startup_heap


class _Node:
    """A container the collector tracks; ``self.me = self`` makes it a cycle."""


def test_frees_startup_garbage_and_freezes_what_lives() -> None:
    gc.disable()  # no automatic collection between building the cycles and the call
    try:
        kept = _Node()
        kept.me = kept
        dead = _Node()
        dead.me = dead
        dead_ref = weakref.ref(dead)
        del dead
        assert dead_ref() is not None  # only a collection frees a cycle

        frozen = freeze_startup_heap()

        assert dead_ref() is None, "start-up garbage must be collected, not frozen"
        # Other threads of the test process (servers left by earlier tests) may free frozen
        # objects at any moment, so the count is only checked to be the freeze's, not exact.
        assert frozen > 0 and gc.get_freeze_count() > 0
        assert not any(o is kept for o in gc.get_objects()), "a full collection still walks it"
        gc.collect()
        assert kept.me is kept
    finally:
        gc.unfreeze()
        gc.enable()
