"""The timeout watchdog of the GPU backends (cuda, hip).

A GPU wait cannot time out by itself, so a thread tracks each eager call's completion event; past the
deadline it reads this rank's flag words (for the message), records the error, which the communicator raises on
its next use, and releases every stuck wait of this rank, so that the GPU does not stay hung.

Reading the words and releasing the waits are GPU work on a stream of their own, which may share a hardware queue
with a stuck stream and wait behind it (likely why, with four ranks on one H100, the read never came back): both are
bounded (``RELEASE_S``), so the error is said whatever the GPU does; a release that does not complete is said too.

The engine provides ``rank``, ``timeout_s``, ``device``, ``read_own_flags(wait_s)`` (the words, or None if not
back within ``wait_s``), ``release_waits(value, wait_s)`` (True if the release completed within ``wait_s``) and
``enter_watchdog_thread()`` (per-thread driver set-up, e.g. relaxed stream-capture mode, so that polling events
does not invalidate a graph capture the application runs on another thread).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Optional

from ..errors import DmaCollTimeoutError

RELEASE_S = 5.0  # how long the watchdog waits for its own read of the flag words, and for its release


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
        words = eng.read_own_flags(RELEASE_S)
        seen = (f"flag words were {words}" if words is not None else
                f"its flag words could not be read within {RELEASE_S:g} s (the GPU queue that reads them is held)")
        self.error = DmaCollTimeoutError(
            f"rank {eng.rank}: {label} did not complete within {eng.timeout_s:g} s; {seen}. "
            "A peer died, hangs, or the ranks called collectives in a different order. The stuck GPU waits "
            "were released; this communicator is unusable, create a new one.")
        self.pending.clear()
        print(f"[dmacoll] {self.error}", flush=True)
        # only now release: a host thread blocked on the GPU resumes at once and its next call must see the error
        if not eng.release_waits(value, RELEASE_S):
            print(f"[dmacoll] rank {eng.rank}: releasing the stuck GPU waits did not complete within {RELEASE_S:g} s; "
                  "this process's GPU work may stay blocked: end the process", flush=True)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=1.0)


def completes(stream, wait_s: float) -> bool:
    """Whether the work queued on ``stream`` (a torch stream) so far ends within ``wait_s``: polled, so the
    watchdog never blocks on a GPU queue longer than that."""
    done = stream.record_event()
    deadline = time.monotonic() + wait_s
    while not done.query():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True
