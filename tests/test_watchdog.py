"""The GPU backends' shared timeout watchdog, driven with a fake engine and fake events (no GPU)."""
from __future__ import annotations

import threading
import time

import pytest

from dmacoll.backends.watchdog import Watchdog, completes
from dmacoll.errors import DmaCollDeviceError, DmaCollTimeoutError
from dmacoll.executor import flag_index
from dmacoll.plan import DONE, READY


class FakeEvent:
    def __init__(self, done: bool = False):
        self.done = done

    def query(self) -> bool:
        return self.done


class FakeEngine:
    def __init__(self, timeout_s: float):
        self.rank, self.world, self.timeout_s, self.device = 1, 3, timeout_s, None
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


def test_an_idle_thread_does_not_poll_and_a_tracked_call_wakes_it():
    # a communicator that makes no calls (the vLLM plugin's where it routes nothing) costs its process no wake-ups
    eng = FakeEngine(timeout_s=60)
    dog = eng.dog = Watchdog(eng, "test-watchdog", poll_s=0.001)
    polls = []
    real = dog.poll
    dog.poll = lambda: (polls.append(1), real())
    try:
        assert eng.thread_entered.wait(5)
        time.sleep(0.1)
        assert polls == []  # a hundred poll intervals, no call: asleep
        running = FakeEvent()
        dog.track(running, "all_gather call #1", 1)
        deadline = time.monotonic() + 5
        while not polls and time.monotonic() < deadline:
            time.sleep(0.001)
        assert polls and dog.pending  # polling the call in flight
        running.done = True
        while dog.pending and time.monotonic() < deadline:
            time.sleep(0.001)
        assert not dog.pending and dog.error is None  # retired
        time.sleep(0.05)
        settled = len(polls)
        time.sleep(0.1)
        assert len(polls) == settled  # asleep again
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


class BrokenEvent:
    """The end of a call after a sticky CUDA error: every query raises, as torch's does."""

    def query(self) -> bool:
        raise RuntimeError("CUDA error: unspecified launch failure\nCUDA kernel errors might be asynchronously ...")


def test_a_sticky_device_error_is_recorded_once_naming_the_call():
    eng = FakeEngine(timeout_s=60)
    dog = eng.dog = Watchdog(eng, "test-watchdog", start=False)
    dog.track(BrokenEvent(), "all_to_all_v call #3 (b2b/push/reset/copy/memop, waiting on rank(s) 0)", 1)
    dog.poll()  # never raises
    assert isinstance(dog.error, DmaCollDeviceError)
    message = str(dog.error)
    assert message.startswith("rank 1: all_to_all_v call #3") and "unspecified launch failure" in message
    assert "asynchronously" not in message  # torch's advice lines are left out
    assert not dog.pending and eng.released == []  # nothing is released on a device that no longer runs


def test_the_thread_survives_a_sticky_device_error(monkeypatch):
    died = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args))
    eng = FakeEngine(timeout_s=60)
    dog = eng.dog = Watchdog(eng, "test-watchdog", poll_s=0.001)
    try:
        dog.track(BrokenEvent(), "all_gather call #9", 1)
        deadline = time.monotonic() + 5
        while dog.error is None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert isinstance(dog.error, DmaCollDeviceError) and "all_gather call #9" in str(dog.error)
        dog._thread.join(timeout=5)
        assert not dog._thread.is_alive() and died == []  # it stopped by itself, without an unhandled exception
    finally:
        dog.close()


class StuckQueue:
    """One rank's GPU queue stuck in a call: it waits on ``waits`` (flag words) in order, consuming each (1 -> 0) as
    soon as it is set, as cuStreamWaitValue32 + the reset write do; ``arrived``: the signals that came."""

    def __init__(self, world: int, waits: list[int], arrived: set[int], timeout_s: float = 0.0):
        self.rank, self.world, self.timeout_s, self.device = 0, world, timeout_s, None
        self.words = [0] * (3 * 3 * world + 6)
        self.waits, self.at = waits, 0
        for i in arrived:
            self.words[i] = 1
        self.run()

    def run(self) -> None:
        while self.at < len(self.waits) and self.words[self.waits[self.at]] == 1:
            self.words[self.waits[self.at]] = 0
            self.at += 1

    def enter_watchdog_thread(self) -> None:
        pass

    def read_own_flags(self, wait_s: float):
        self.run()
        return list(self.words)

    def write_own_flag(self, index: int, value: int, wait_s: float) -> bool:
        self.words[index] = value
        return True

    def release_waits(self, value: int, wait_s: float) -> bool:
        self.words = [value] * len(self.words)
        self.run()
        return True


def word(world: int, phase: int, peer: int) -> int:
    return flag_index(world, "reset", phase, peer)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_a_timeout_names_the_peer_that_never_signalled(world):
    """Rank 0 of a b2b push waits READY from every peer, then DONE from every peer; the last rank never came. The
    others signalled READY (consumed) but, stuck on the last rank themselves, no DONE: the message names the last
    rank, as the host emulator does, not every peer the call waits on, and not the raw words."""
    absent = world - 1
    peers = list(range(1, world))
    waits = [word(world, READY, p) for p in peers] + [word(world, DONE, p) for p in peers]
    arrived = {word(world, READY, p) for p in peers if p != absent}
    eng = StuckQueue(world, waits, arrived)
    dog = Watchdog(eng, "test-watchdog", start=False)
    dog.track(FakeEvent(), "all_to_all call #5 (b2b/push/reset/memop/memop, waiting on rank(s) ...)", 1, waits)
    time.sleep(0.001)
    dog.poll()
    message = str(dog.error)
    assert f"waited more than 0 s for rank {absent} to signal READY" in message, message
    assert f"nor did DONE from rank(s) {', '.join(map(str, peers))} arrive" in message
    assert "flag words were" not in message
    assert eng.at == len(waits)  # released: the queue drained


def test_a_timeout_does_not_blame_peers_whose_signal_was_consumed():
    """pcpy: each peer's READY on a queue of its own (all consumed but the absent rank's), then the DONEs, of which
    rank 1's arrived (1, not yet consumed) and rank 2's did not (rank 2 waits for rank 3 too)."""
    world = 4
    waits = [word(world, READY, 1), word(world, READY, 2), word(world, READY, 3),
             word(world, DONE, 1), word(world, DONE, 2), word(world, DONE, 3)]
    eng = StuckQueue(world, waits, {word(world, READY, 1), word(world, READY, 2)})
    eng.words[word(world, DONE, 1)] = 1  # arrived while the queue was still stuck on READY from rank 3
    dog = Watchdog(eng, "test-watchdog", start=False)
    dog.track(FakeEvent(), "all_gather call #2", 1, waits)
    time.sleep(0.001)
    dog.poll()
    message = str(dog.error)
    assert "for rank 3 to signal READY (nor did DONE from rank(s) 2, 3 arrive)" in message, message


def test_an_epoch_timeout_reads_the_sequence_numbers():
    world = 4
    waits = [flag_index(world, "epoch", READY, p) for p in (1, 2, 3)]
    eng = StuckQueue(world, [], set())
    for i, seq in zip(waits, (12, 11, 12)):  # rank 2 is one call behind
        eng.words[i] = seq
    dog = Watchdog(eng, "test-watchdog", start=False)
    dog.track(FakeEvent(), "all_gather call #12", 12, waits, epoch=True)
    time.sleep(0.001)
    dog.poll()
    assert "for rank 2 to signal READY" in str(dog.error) and "nor did" not in str(dog.error)


def test_a_held_release_queue_falls_back_to_the_raw_words():
    """If the release stream cannot write the words one by one, the message shows them raw instead of claiming that
    every signal arrived."""
    world = 2
    waits = [word(world, READY, 1), word(world, DONE, 1)]
    eng = StuckQueue(world, waits, set())
    eng.write_own_flag = lambda index, value, wait_s: False
    dog = Watchdog(eng, "test-watchdog", start=False)
    dog.track(FakeEvent(), "all_gather call #1", 1, waits)
    time.sleep(0.001)
    dog.poll()
    message = str(dog.error)
    assert "flag words were [" in message and "had arrived" not in message, message


def test_a_thread_released_mid_diagnosis_raises_the_final_message():
    """Releasing the words one by one lets a host thread blocked on the GPU go on before the message is worked out
    (seen on 2x H200: the next call did not raise at all); ``raised`` waits for the final one."""
    world = 4
    waits = [word(world, READY, p) for p in (1, 2, 3)]
    eng = StuckQueue(world, waits, {word(world, READY, 1)})
    slow, released_at = eng.write_own_flag, []

    def write_and_linger(index, value, wait_s):
        done = slow(index, value, wait_s)
        released_at.append(time.monotonic())
        time.sleep(0.2)  # the host thread that was blocked on this queue runs now
        return done

    eng.write_own_flag = write_and_linger
    dog = Watchdog(eng, "test-watchdog", start=False)
    dog.track(FakeEvent(), "all_gather call #4", 1, waits)
    time.sleep(0.001)
    expiring = threading.Thread(target=dog.poll)
    expiring.start()
    while not released_at:
        time.sleep(0.001)
    error = dog.raised()  # the blocked thread's next call
    expiring.join()
    assert error is dog.error and "for rank 2 to signal READY" in str(error), str(error)
