"""The timeout watchdog's thread: asleep while no call is in flight (a communicator that makes no calls costs its
process no wake-ups), awake and polling once a call is tracked, gone on close."""
import threading
import time

from dmacoll.backends.watchdog import Watchdog


class Engine:
    timeout_s = 30.0

    def enter_watchdog_thread(self):
        pass


class Event:
    def __init__(self):
        self.done = threading.Event()

    def query(self):
        return self.done.is_set()


def test_an_idle_watchdog_does_not_poll_and_a_tracked_call_wakes_it():
    dog = Watchdog(Engine(), "test", poll_s=0.001)
    polls = []
    real = dog.poll
    dog.poll = lambda: (polls.append(1), real())
    try:
        time.sleep(0.1)
        assert polls == []  # a hundred poll intervals, no call: asleep
        event = Event()
        dog.track(event, "all_gather call #1", 1)
        deadline = time.monotonic() + 5
        while not polls and time.monotonic() < deadline:
            time.sleep(0.001)
        assert polls and dog.pending  # polling the call in flight
        event.done.set()
        while dog.pending and time.monotonic() < deadline:
            time.sleep(0.001)
        assert not dog.pending  # retired
        time.sleep(0.05)
        settled = len(polls)
        time.sleep(0.1)
        assert len(polls) == settled  # asleep again
    finally:
        dog.close()
    assert not dog._thread.is_alive()
