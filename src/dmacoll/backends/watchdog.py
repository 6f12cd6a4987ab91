"""The timeout watchdog of the GPU backends (cuda, hip).

A GPU wait cannot time out by itself, so a thread tracks each eager call's completion event; past the
deadline it reads this rank's flag words (for the message), releases every stuck wait of this rank (the GPU
never stays hung) and records the error, which the communicator raises on its next use.

The engine provides ``rank``, ``timeout_s``, ``device``, ``read_own_flags()``, ``release_waits(value)`` and
``enter_watchdog_thread()`` (per-thread driver set-up, e.g. relaxed stream-capture mode, so that polling events
does not invalidate a graph capture the application runs on another thread).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Optional

from ..errors import DmaCollTimeoutError


class Watchdog:
    """Tracks eager calls; on a timeout releases this rank's stuck waits and records the error."""

    def __init__(self, engine, name: str, poll_s: float = 0.005, start: bool = True):
        self.engine = engine
        self.pending: deque = deque()
        self.error: Optional[DmaCollTimeoutError] = None
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        if start:
            self._thread.start()

    def track(self, event, label: str, value: int) -> None:
        """Watch ``event`` (the call's end); ``value`` satisfies every wait of this rank if it expires."""
        self.pending.append((event, time.monotonic() + self.engine.timeout_s, label, value))

    def poll(self) -> None:
        """Retire completed calls, oldest first; expire the oldest if it is past its deadline."""
        while self.pending:
            event, deadline, label, value = self.pending[0]
            if event.query():
                self.pending.popleft()
            elif time.monotonic() > deadline:
                self.expire(label, value)
            else:
                break

    def _loop(self) -> None:
        self.engine.enter_watchdog_thread()
        while not self._stop.wait(self.poll_s):
            self.poll()

    def expire(self, label: str, value: int) -> None:
        eng = self.engine
        words = eng.read_own_flags()
        self.error = DmaCollTimeoutError(
            f"rank {eng.rank}: {label} did not complete within {eng.timeout_s:g} s; flag words were {words}. "
            "A peer died, hangs, or the ranks called collectives in a different order. The stuck GPU waits "
            "were released; this communicator is unusable, create a new one.")
        self.pending.clear()
        # only now release: a host thread blocked on the GPU resumes at once and its next call must see the error
        eng.release_waits(value)
        print(f"[dmacoll] {self.error}", flush=True)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=1.0)
