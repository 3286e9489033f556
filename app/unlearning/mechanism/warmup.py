"""The compiled kernels' warm-up: one background compilation per process (issue 23: no request waits for it).

Both kernel modules (fast.py: the OGD loops -- the passive one and the exact families' of exact_ogd.py -- and
the grid noise step; fast_dgauss.py: the discrete Gaussian sampler) start their compilation through a
``BackgroundCompile``; until it has loaded the kernels their callers take the numpy / pure path.
"""
from __future__ import annotations

import threading
from typing import Callable


class BackgroundCompile:
    """Runs ``compile_kernels`` at most once per process, in a daemon thread named ``name``."""

    def __init__(self, compile_kernels: Callable[[], object], name: str):
        self._compile, self._name = compile_kernels, name
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the compilation unless it was started before (cheap to call on every request)."""
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._compile, name=self._name, daemon=True)
                self._thread.start()

    def running(self) -> bool:
        """Whether the compilation started here still runs."""
        t = self._thread
        return t is not None and t.is_alive()
