"""The GPU backends' shared timeout watchdog, driven with a fake engine and fake events (no GPU)."""
from __future__ import annotations

import threading
import time

from dmacoll.backends.watchdog import Watchdog, completes
from dmacoll.errors import DmaCollTimeoutError


class FakeEvent:
    def __init__(self, done: bool = False):
        self.done = done

    def query(self) -> bool:
        return self.done


class FakeEngine:
    def __init__(self, timeout_s: float):
        self.rank, self.timeout_s, self.device = 1, timeout_s, None
        self.words = [3, 0, 7]
        self.released: list[int] = []
        self.stuck = False  # True: the GPU queue of the watchdog's own read and release never runs
        self.thread_entered = threading.Event()

    def enter_watchdog_thread(self) -> None:
        self.thread_entered.set()

    def read_own_flags(self, wait_s: float):
        return None if self.stuck else list(self.words)

    def release_waits(self, value: int, wait_s: float) -> bool:
        # a host thread blocked on the GPU resumes now: the error must already be there for its next call
        self.error_when_released = self.dog.error
        self.released.append(value)
        return not self.stuck


def test_completed_calls_retire_and_pending_ones_wait_for_their_deadline():
    eng = FakeEngine(timeout_s=60)
    dog = Watchdog(eng, "test-watchdog", start=False)
    done, running = FakeEvent(done=True), FakeEvent()
    dog.track(done, "all_gather call #1", 5)
    dog.track(running, "all_gather call #2", 6)
    dog.poll()
    assert [p[2] for p in dog.pending] == ["all_gather call #2"]
    assert dog.error is None and eng.released == []
    running.done = True
    dog.poll()
    assert not dog.pending and dog.error is None


def test_a_call_past_its_deadline_releases_the_waits_and_records_the_error():
    eng = FakeEngine(timeout_s=0.0)
    dog = eng.dog = Watchdog(eng, "test-watchdog", start=False)
    dog.track(FakeEvent(), "all_to_all call #4", 9)
    dog.track(FakeEvent(), "all_to_all call #5", 10)
    time.sleep(0.001)
    dog.poll()
    assert eng.released == [9]  # the oldest stuck call's value satisfies every wait of this rank
    assert isinstance(dog.error, DmaCollTimeoutError) and eng.error_when_released is dog.error
    message = str(dog.error)
    assert "rank 1" in message and "all_to_all call #4" in message and str(eng.words) in message
    assert not dog.pending  # the communicator is unusable: nothing more is tracked


def test_the_thread_sets_itself_up_and_expires_a_stuck_call():
    eng = FakeEngine(timeout_s=0.05)
    dog = eng.dog = Watchdog(eng, "test-watchdog", poll_s=0.001)
    try:
        assert eng.thread_entered.wait(5)
        dog.track(FakeEvent(), "reduce_scatter call #1", 2)
        deadline = time.monotonic() + 5
        # the error is recorded before the release (a thread released from the GPU must find it): wait for both
        while (dog.error is None or not eng.released) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert isinstance(dog.error, DmaCollTimeoutError) and eng.released == [2]
    finally:
        dog.close()
    assert not dog._thread.is_alive()


def test_a_held_read_and_release_still_record_and_say_the_error(capsys):
    # four ranks on one H100: the watchdog's own read of the flag words never came back, and no error was said
    eng = FakeEngine(timeout_s=0.0)
    eng.stuck = True
    dog = eng.dog = Watchdog(eng, "test-watchdog", start=False)
    dog.track(FakeEvent(), "all_gather call #7", 3)
    time.sleep(0.001)
    dog.poll()
    assert isinstance(dog.error, DmaCollTimeoutError) and eng.error_when_released is dog.error
    assert "all_gather call #7" in str(dog.error) and "could not be read" in str(dog.error)
    printed = capsys.readouterr().out
    assert str(dog.error) in printed and "did not complete within" in printed.splitlines()[-1]


class QueuedStream:
    """A torch-like stream whose recorded event completes after ``polls`` queries (never, with None)."""

    def __init__(self, polls):
        self.polls = polls

    def record_event(self) -> "QueuedStream":
        return self

    def query(self) -> bool:  # the recorded event
        if self.polls is None:
            return False
        self.polls -= 1
        return self.polls < 0


def test_completes_polls_and_never_waits_past_its_bound():
    assert completes(QueuedStream(3), wait_s=5.0)
    start = time.monotonic()
    assert not completes(QueuedStream(None), wait_s=0.05)
    assert time.monotonic() - start < 2.0
