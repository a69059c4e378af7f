"""The collector's view of a long-running process: what start-up leaves behind is frozen.

Importing torch, transformers and the grammar backends, and building a tokenizer, leaves about
350,000 objects that the collector tracks and that live as long as the process. CPython's full
(oldest-generation) collection walks every one of them, about 180 ms on a small machine, with
every thread stopped; it runs whenever enough objects have survived into the oldest generation
since the last one, so sooner or later it lands in a mask, a compile or a decode step.
Corral's compiles and matchers allocate enough to trigger one every few thousand schemas
(MaskBench's single slowest Corral mask, 187-349 ms against a few ms of its own work).
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect start-up's garbage, then move every object alive now into the collector's
    permanent generation, which no collection walks again; later full collections cost what
    was allocated since. Call it once a process has loaded what it keeps (the tokenizer, the
    model, the compile service). Returns how many objects are frozen in all.

    A cycle among frozen objects that later becomes garbage is never freed: only what lives as
    long as the process should be here when this is called.
    """
    gc.collect()  # start-up's garbage is freed, not frozen
    gc.freeze()
    return gc.get_freeze_count()
