"""The timeout watchdog of the GPU backends (cuda, hip).

A GPU wait cannot time out by itself, so a thread tracks each eager call's completion event; past the
deadline it works out which peers never signalled (below), records the error, which the communicator raises on its
next use, and releases every stuck wait of this rank, so that the GPU does not stay hung.

Which peers never signalled: a call knows the flag words it waits on, in issue order (``Lowered.words``). In the
epoch mode a word holds the signaller's sequence number, so a word behind the call's number never arrived. In the
reset mode a wait consumes its word (1 back to 0), so a word that reads 0 either arrived and was consumed or never
came; the watchdog tells them apart by releasing the words one at a time, in issue order: a word set to 1 that the
GPU consumes at once was being waited for (or about to be), so its signal never came; one that stays 1 had been
consumed already. The host emulator names the stuck wait directly; this names the same peers.

A sticky CUDA error (a faulting copy or kernel: "unspecified launch failure", "illegal address") makes every later
query of this process's GPU work fail, the watchdog's event queries included: it becomes the communicator's error
(``DmaCollDeviceError``, naming the call it was tracking), once, and the thread stops; the peers then time out
waiting for this rank, and their timeouts name it. Never an exception that kills the thread, never a hang.

Reading the words and releasing the waits are GPU work on a stream of their own, which may share a hardware queue
with a stuck stream and wait behind it (likely why, with four ranks on one H100, the read never came back): every
such step is bounded (``RELEASE_S``), so the error is said whatever the GPU does; a release that does not complete
is said too.

The engine provides ``rank``, ``world``, ``timeout_s``, ``device``, ``read_own_flags(wait_s)`` (the words, or None if
not back within ``wait_s``), ``write_own_flag(index, value, wait_s)`` (True once written), ``release_waits(value,
wait_s)`` (True if the release completed within ``wait_s``) and ``enter_watchdog_thread()`` (per-thread driver
set-up, e.g. relaxed stream-capture mode, so that polling events does not invalidate a graph capture the
application runs on another thread).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Optional, Sequence

from ..errors import DmaCollDeviceError, DmaCollError, DmaCollTimeoutError
from ..plan import NUM_PHASES

RELEASE_S = 5.0  # how long the watchdog waits for its own read of the flag words, and for its release
CONSUMED_S = 0.05  # how long a word released on its own may take to be consumed by a queue stuck on it
PHASE_NAMES = ("READY", "DONE", "DONE")  # by phase (DONE_ALT is DONE to a reader)


class Watchdog:
    """Tracks eager calls; on a timeout names the silent peers, releases this rank's stuck waits and records the
    error; on a sticky GPU error records that."""

    def __init__(self, engine, name: str, poll_s: float = 0.005, start: bool = True):
        self.engine = engine
        self.pending: deque = deque()
        self.error: Optional[DmaCollError] = None
        self.poll_s = poll_s
        self._settled = threading.Event()  # clear while a timeout's message is being worked out
        self._settled.set()
        self._stop = threading.Event()
        # set by track() and on stopping: with no call in flight the thread sleeps on it instead of polling (a
        # communicator that makes no calls, e.g. the vLLM plugin's where it routes nothing, costs its process no
        # wake-ups and no GIL hand-offs)
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        if start:
            self._thread.start()

    def track(self, event, label: str, value: int, words: Sequence[int] = (), epoch: bool = False) -> None:
        """Watch ``event`` (the call's end); ``value`` satisfies every wait of this rank if it expires; ``words``:
        the flag words the call waits on, in issue order; ``epoch``: they carry sequence numbers (sync='epoch')."""
        self.pending.append((event, time.monotonic() + self.engine.timeout_s, label, value, tuple(words), epoch))
        self._wake.set()

    def poll(self) -> None:
        """Retire completed calls, oldest first; expire the oldest if it is past its deadline."""
        while self.pending:
            event, deadline, label, value, words, epoch = self.pending[0]
            try:
                done = event.query()
            except Exception as e:  # noqa: BLE001 - a sticky device error: every later query fails alike
                self.device_failed(label, e)
                return
            if done:
                self.pending.popleft()
            elif time.monotonic() > deadline:
                self.expire(label, value, words, epoch)
            else:
                break

    def _loop(self) -> None:
        try:
            self.engine.enter_watchdog_thread()
            while not self._stop.is_set():
                if not self.pending:  # idle: sleep until a call is tracked (track appends, then sets it)
                    self._wake.wait()
                    self._wake.clear()
                elif not self._stop.wait(self.poll_s):
                    self.poll()
        except Exception as e:  # noqa: BLE001 - never let the thread die silently: the next call raises it
            self.device_failed("the timeout watchdog", e)

    def device_failed(self, label: str, error: BaseException) -> None:
        """The GPU reported an error while ``label`` was in flight: record it (once) and stop watching."""
        eng = self.engine
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        self.error = DmaCollDeviceError(
            f"rank {eng.rank}: {label} failed on the GPU: {first}. A CUDA error of this kind is sticky: this process "
            "can no longer use the GPU (restart it); its peers time out waiting for this rank.")
        self.pending.clear()
        self._halt()
        print(f"[dmacoll] {self.error}", flush=True)

    def raised(self) -> Optional[DmaCollError]:
        """The recorded error, once its message is final: releasing the words one by one (``silent_words``) lets a
        host thread blocked on the GPU go on before the message is, and its next call must raise the final one."""
        if self.error is not None:
            self._settled.wait(timeout=4 * RELEASE_S)
        return self.error

    def expire(self, label: str, value: int, words: Sequence[int] = (), epoch: bool = False) -> None:
        eng = self.engine
        self._settled.clear()
        try:
            self.error = DmaCollTimeoutError(f"rank {eng.rank}: {label} did not complete within {eng.timeout_s:g} s")
            try:
                said = self._describe(words, *self.silent_words(words, value, epoch))
            except Exception:  # noqa: BLE001 - a diagnosis that fails must not stop the error or the release
                said = self._describe(words, None, None)
            self.error = DmaCollTimeoutError(f"rank {eng.rank}: {label} {said}. The stuck GPU waits were released; "
                                             "this communicator is unusable, create a new one.")
        finally:
            self._settled.set()
        self.pending.clear()
        print(f"[dmacoll] {self.error}", flush=True)
        # only now release: a host thread blocked on the GPU resumes at once and its next call must see the error
        try:
            released = eng.release_waits(value, RELEASE_S)
        except Exception:  # noqa: BLE001 - the device is gone: nothing left to release
            released = False
        if not released:
            print(f"[dmacoll] rank {eng.rank}: releasing the stuck GPU waits did not complete within {RELEASE_S:g} s; "
                  "this process's GPU work may stay blocked: end the process", flush=True)

    def silent_words(self, words: Sequence[int], value: int, epoch: bool = False
                     ) -> tuple[Optional[list[int]], Optional[list[int]]]:
        """(the words of ``words`` whose signal never arrived, in issue order (module docstring); every flag word as
        it read before any release). The first is None where the words could not be read or released one by one
        (those named so far, if any, are still returned), the second where they could not be read."""
        eng = self.engine
        before = eng.read_own_flags(RELEASE_S)
        if before is None:
            return None, None
        if epoch:  # a word behind the call's sequence number (wrapping) never arrived
            return [i for i in words if (before[i] - value) & 0xFFFFFFFF >= 1 << 31], before
        silent: list[int] = []
        for i in words:
            if before[i] == value:  # arrived, not yet consumed
                continue
            if not eng.write_own_flag(i, value, RELEASE_S):
                return silent or None, before
            deadline = time.monotonic() + CONSUMED_S
            while True:
                now = eng.read_own_flags(RELEASE_S)
                if now is None:
                    return silent or None, before
                if now[i] != value:  # consumed at once: a queue was waiting for it
                    silent.append(i)
                    break
                if time.monotonic() > deadline:  # consumed before the timeout: it had arrived
                    break
                time.sleep(0.002)
        return silent, before

    def _describe(self, words: Sequence[int], silent: Optional[list[int]], before: Optional[list[int]]) -> str:
        """What the timeout message says of the call: the peers that never signalled, the host emulator's way; the
        raw flag words where the call's waits are not known or every one of them had arrived."""
        eng = self.engine
        if not silent:
            how = (f"its flag words could not be read within {RELEASE_S:g} s (the GPU queue that reads them is held)"
                   if before is None else f"flag words were {before}" if not words or silent is None else
                   f"every signal it waits for had arrived (flag words were {before})")
            return (f"did not complete within {eng.timeout_s:g} s; {how}. A peer died, hangs, or the ranks called "
                    "collectives in a different order")
        said = [(i % eng.world, PHASE_NAMES[i // eng.world % NUM_PHASES]) for i in silent]
        first, phase = said[0]
        others = {}
        for peer, name in said[1:]:
            others.setdefault(name, []).append(str(peer))
        more = "; ".join(f"{name} from rank(s) {', '.join(peers)}" for name, peers in others.items())
        return (f"waited more than {eng.timeout_s:g} s for rank {first} to signal {phase}"
                + (f" (nor did {more} arrive)" if more else "")
                + f". Rank {first} died, hangs, or the ranks called collectives in a different order")

    def _halt(self) -> None:
        self._stop.set()
        self._wake.set()

    def close(self) -> None:
        self._halt()
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
