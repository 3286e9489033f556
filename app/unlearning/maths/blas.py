"""Deterministic dense linear algebra: BLAS and LAPACK calls pinned to one thread.

OpenBLAS splits a factorisation's blocks over its thread pool, and the order in which the partial sums meet depends
on how many threads it uses: exact_ridge's published weights at d = 200 differed by up to 8.2e-15 between
``OPENBLAS_NUM_THREADS`` 1 and 2 (issue 37), so a receipt's parameter hash did not reproduce on a machine with another
core count.  ``one_blas_thread()`` pins every BLAS library loaded in the process (numpy's and scipy's OpenBLAS) to one
thread for the duration of a block (threadpoolctl), so what is computed inside depends on the inputs alone -- on one
BLAS build: another OpenBLAS version, or another CPU kernel (Haswell vs SkylakeX), may still round differently.

The thread count is a process-wide setting of the library, so the blocks are serialised by a lock: two pinned blocks
never interleave their set/restore, and the setting is restored to what it was.  Other BLAS calls that run while a
block holds the pin run single-threaded for that time (slower, never different: nothing else here depends on the
thread count).  Cost: ~12 us per block; a solve at p = 2 049 runs on one core instead of all (issue 37's
measurement is in docs/performance.md).

``limit_process`` sets the process's own count once (the service: ``OLU_BLAS_THREADS``, default 1, at start-up):
OpenBLAS's idle workers spin for ~0.1 s after each threaded call or thread-count change, so a pool of 2 that every
pinned block restored cost an exact_ridge forget at D = 1 025 ~180 ms of CPU (docs/performance.md §16).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

_LOCK = threading.RLock()
_CONTROLLER = None


def _controller():
    global _CONTROLLER
    if _CONTROLLER is None:
        import scipy.linalg  # noqa: F401  (scipy's own OpenBLAS is loaded before the scan, so it is pinned too)
        from threadpoolctl import ThreadpoolController

        _CONTROLLER = ThreadpoolController()  # scans the loaded libraries once (~ms): kept for the process
    return _CONTROLLER


_PROCESS_LIMIT = None


def limit_process(threads: int) -> None:
    """Set every BLAS library of the process to ``threads`` threads from now on (0: leave the library's own count);
    the service calls it once at start-up (``OLU_BLAS_THREADS``).  Pinned blocks restore this count after them."""
    global _PROCESS_LIMIT
    if threads > 0:
        with _LOCK:
            _PROCESS_LIMIT = _controller().limit(limits=int(threads), user_api="blas")  # kept: never restored


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Run the block with every BLAS library of the process on one thread (re-entrant)."""
    with _LOCK:
        with _controller().limit(limits=1, user_api="blas"):
            yield
