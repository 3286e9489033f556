"""Short pauses of Python's cyclic garbage collector (issue 37, fairness).

A full (generation 2) collection walks every container object the process tracks, and it runs on whichever thread
allocates when the thresholds are crossed, holding the GIL: with the modules, the compiled kernels' typing tables and
the app loaded (~200 000 objects here), each took ~105 ms, and a tenant sending small requests that allocate many
short-lived objects (1 000 feature dictionaries per predict) set one off every ~0.5 s: every other tenant's requests
stopped meanwhile (fairness bench: B's p99 2.4 -> 104 ms).  The objects loaded at start-up live as long as the process,
so they are moved out of the collector's walk (``gc.freeze``) once start-up is done, and again once the compiled
kernels have loaded in the background (numba's typing tables: ~60 000 more objects).  Frozen objects are still freed
by reference counting; only a reference cycle among them would stay (none is made after start-up on purpose).
Measured on that bench: full collections 105 ms -> 17 ms after the first freeze.
"""
from __future__ import annotations

import gc
import threading
import time
from typing import Callable


def freeze() -> None:
    """Collect what is garbage now, then move every object still tracked out of the later collections' walk."""
    gc.collect()
    gc.freeze()


def freeze_at_start_up(still_loading: Callable[[], bool], poll: float = 0.5, limit: float = 900.0) -> None:
    """``freeze`` now, and once more in a daemon thread when ``still_loading()`` turns false (the compiled kernels),
    or after ``limit`` seconds."""
    freeze()

    def later() -> None:
        end = time.monotonic() + limit
        while still_loading() and time.monotonic() < end:
            time.sleep(poll)
        freeze()

    threading.Thread(target=later, name="olu-gc-freeze", daemon=True).start()
