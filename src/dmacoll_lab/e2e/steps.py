"""What a forward (model.py, seqpar.py) yields to the schedule that drives it (schedule.py): a ``Call`` starts a
collective and gets back a ``Handle`` at once, a ``Wait`` on that handle gets back the collective's output, safe
to read on the compute stream; ``collective`` does both in one step."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Generator, Optional

import torch


@dataclass
class Call:
    op: str
    site: str  # where in the model (calls.py names them), for the check against the expected calls
    out: torch.Tensor
    x: Optional[torch.Tensor] = None
    mb: int = 0  # set by the driver
    overlapped: bool = False  # set by the driver: the call ran beside compute (an overlapped schedule)
    counts: Optional[list] = None  # all_to_all_v: its split matrix (elements), known on the host

    def record(self) -> tuple[int, str, str, int]:
        return self.mb, self.site, self.op, self.out.numel()


@dataclass
class Handle:
    call: Call
    done: Optional[object] = None  # the communication stream's event after the call (None: ran in line)
    waited: bool = False


@dataclass
class Wait:
    handle: Handle


Forward = Generator[object, object, object]


def collective(op: str, site: str, out: torch.Tensor, x: Optional[torch.Tensor] = None,
               counts: Optional[list] = None):
    """``result = yield from collective(...)``: start a collective and wait for it (a serial step)."""
    handle = yield Call(op, site, out, x, counts=counts)
    return (yield Wait(handle))
