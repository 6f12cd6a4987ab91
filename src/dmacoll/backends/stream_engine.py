"""What the two GPU engines (cuda, and hip on a ROCm build of torch) share above their driver calls.

Both run on ``torch.cuda`` streams and events (HIP ones on ROCm), so prelaunch gates, the bracketing of a
call (the watchdog tracks each eager call's end), and ``prerecord=True`` graph replays are one code. An engine
sets ``device``, ``rank``, ``world``, ``watchdog``, ``main_queue``, ``side_streams``, ``_gate_streams``,
``_gate_done`` and ``_graphs``, and provides ``memops(queue, ops)``; it may override ``flush_queue(queue)`` and
``flush_batched()``, which issue what it holds back on one queue or on all (hip's batched copies).
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from ..executor import MemOp, gate_index, gate_ops
from ..graphs import graph_capture

MAX_RECORDED = 256  # prerecorded graphs kept per engine (each holds its buffers' addresses)


class StreamEngine:
    def flush_queue(self, queue) -> None:
        """Issue the commands held back on ``queue`` for batching; none by default."""

    def flush_batched(self) -> None:
        """Issue the commands held back on every queue; none by default."""

    # -- queues: the caller's stream plus side streams forked from it and joined back -----------------
    def side_streams_for(self, n: int) -> list:
        while len(self.side_streams) < n:
            self.side_streams.append(torch.cuda.Stream(self.device))
        return self.side_streams[:n]

    def parallel(self, tasks: Sequence[Callable[[object], None]]) -> None:
        """``tasks[0]`` on the main queue, each other task on a side stream forked from it and joined back."""
        sides = self.side_streams_for(len(tasks) - 1)
        main = self.main_queue
        self.flush_queue(main)  # the fork must come after the main queue's held-back commands
        fork = torch.cuda.Event()
        fork.record(main)
        joins = []
        for task, stream in zip(tasks[1:], sides):
            stream.wait_event(fork)
            task(stream)
            self.flush_queue(stream)
            done = torch.cuda.Event()
            done.record(stream)
            joins.append(done)
        tasks[0](main)
        self.flush_queue(main)
        for done in joins:
            main.wait_event(done)

    # -- prelaunch gates: calls made while a gate is open go onto a gate stream behind a wait ----
    def submit(self, work: Callable[[], None]) -> None:
        work()  # enqueued on the current stream, which is the gate stream while a gate is open

    def gate_open(self, slot: int) -> None:
        if slot not in self._gate_streams:
            self._gate_streams[slot] = torch.cuda.Stream(self.device)
        stream = self._gate_streams[slot]
        stream.wait_stream(torch.cuda.current_stream(self.device))  # after this communicator's earlier calls
        self.memops(stream, gate_ops(self.world, self.rank, slot))
        self._gate_context = torch.cuda.stream(stream)
        self._gate_context.__enter__()

    def gate_close(self, slot: int) -> None:
        self.flush_batched()
        self._gate_context.__exit__(None, None, None)
        done = torch.cuda.Event()
        done.record(self._gate_streams[slot])
        self._gate_done[slot] = done

    def gate_release(self, slot: int, stream: Optional[torch.cuda.Stream] = None) -> None:
        """One flag write on ``stream`` (a producer's): the gated commands start when it executes."""
        self.memops(stream or torch.cuda.current_stream(self.device),
                    (MemOp(False, self.rank, gate_index(self.world, slot), 1),))

    def gate_wait(self, slot: int, stream: Optional[torch.cuda.Stream] = None) -> None:
        (stream or torch.cuda.current_stream(self.device)).wait_event(self._gate_done.pop(slot))

    # -- prerecord=True ----------------------------------------------------------------------------
    def replay_recorded(self, key: tuple, work: Callable[[], None], label: str, sync: str,
                        words: tuple[int, ...] = ()) -> None:
        """Replay the graph recorded for ``key`` (recording it on first use, on a side stream that waits
        for the current one) on the current stream, then bracket the call as usual."""
        self.raise_timeout()  # a replay does not run ``work`` (whose begin_call raises it): never replay after one
        graph = self._graphs.get(key)
        if graph is None:
            if len(self._graphs) >= MAX_RECORDED:  # ever-new buffers (prerecord='auto' on the caching allocator):
                # the oldest goes, destroyed here and now, outside any capture (dicts keep insertion order)
                self._graphs.pop(next(iter(self._graphs))).reset()
            graph = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with graph_capture(graph, side):
                work()
            self._graphs[key] = graph
        graph.replay()
        self.main_queue = torch.cuda.current_stream(self.device)
        self.end_call(label, sync, 1, words)

    # -- call bracketing -----------------------------------------------------------------------------
    def is_capturing(self) -> bool:
        return torch.cuda.is_current_stream_capturing()

    def capture_id(self) -> Optional[int]:
        """None: this engine cannot tell captures apart (the cuda engine can)."""
        return None

    def raise_timeout(self) -> None:
        """Raise a timeout the watchdog saw since the last call: every later call does, replays included."""
        error = self.watchdog.raised()
        if error is not None:
            raise error

    def begin_call(self, label: str) -> None:
        self.raise_timeout()
        self.main_queue = torch.cuda.current_stream(self.device)

    def end_call(self, label: str, sync: str, value: int, words: tuple[int, ...] = ()) -> None:
        self.flush_batched()
        if torch.cuda.is_current_stream_capturing():
            return  # replays are not tracked; see Communicator.watch
        done = torch.cuda.Event()
        done.record(self.main_queue)
        self.watchdog.track(done, label, value, words, sync == "epoch")

    def close(self) -> None:
        self.watchdog.close()
        self._graphs.clear()  # destroyed now, not by a garbage collection that may run inside someone's capture
