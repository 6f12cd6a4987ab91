"""A schedule per phase (`dmacoll e2e`'s ``phased`` rows): each implementation's decode serial, its prefill
overlapped only where that was predicted and measured to win; derived from the point's measured rows, not run again.

* decode: serial. The measured overlaps of a decode step (``microbatch``) split the batch, and each half reads every
  weight again: a decode step is weight-bound, so they lose (1.04-1.99x of serial at TP4, issue 50).
* prefill: an overlapped schedule (``microbatch``, ``seqpar``) is taken when its compute and communication alone,
  measured on this point (the breakdown), predict that it hides at least ``MARGIN`` of the serial prefill (ideal
  overlap: ``max(compute, comm)`` against serial's ``compute + comm``; the split's own cost is in its compute), and
  its measured TTFT is below serial's; of several, the fastest. Else serial.

The reason of each choice is in the row (``phase_reason``) and printed, so a reader sees why a point stayed serial:
where the communication a prefill could hide is a small part of it, no overlap can win much (the ideal gain is at
most the communication's share)."""
from __future__ import annotations

import math

OVERLAPPED = ("microbatch", "seqpar")
MARGIN = 0.03  # the least share of the serial prefill an overlap must be predicted to hide (noise between repeats)
TTFT_COLUMNS = ("ttft_ms", "ttft_ms_p10", "ttft_ms_p90", "ttft_compute_ms", "ttft_comm_ms", "ttft_ideal_speedup",
                "ttft_realized_speedup", "ttft_fraction_of_ideal", "ttft_fraction_of_ideal_raw", "prefill_calls",
                "pieces", "microbatches")


def _finite(*values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def choose_prefill(serial: dict, candidates: list[dict], margin: float = MARGIN) -> tuple[dict, str]:
    """The prefill row to take of ``serial`` and its overlapped ``candidates`` (rows of one implementation at one
    point), and why (module docstring)."""
    base, compute, comm = serial["ttft_ms"], serial.get("ttft_compute_ms"), serial.get("ttft_comm_ms")
    if not _finite(base, compute, comm):
        return serial, "serial: no breakdown of the serial prefill to judge an overlap by"
    chosen, reasons = serial, []
    for row in candidates:
        name, ttft = row["schedule"], row.get("ttft_ms")
        c, m = row.get("ttft_compute_ms"), row.get("ttft_comm_ms")
        if not _finite(ttft, c, m):
            reasons.append(f"{name} not measured")
            continue
        hides = compute + comm - max(c, m)
        if hides < margin * base:
            reasons.append(f"{name} would hide at most {hides:.2f} ms of {base:.2f} (compute {compute:.2f} -> "
                           f"{c:.2f} ms split, comm {m:.2f} ms)")
        elif ttft >= base:
            reasons.append(f"{name} predicted to hide {hides:.2f} ms but measured {ttft:.2f} >= {base:.2f} ms")
        else:
            reasons.append(f"{name} hides {base - ttft:.2f} ms (predicted {hides:.2f})")
            if ttft < chosen["ttft_ms"]:
                chosen = row
    return chosen, f"{chosen['schedule']}: " + "; ".join(reasons or ["no overlapped schedule ran"])


def phased(rows: list[dict], derive) -> list[dict]:
    """One ``phased`` row per implementation of one point's ``rows`` that has a serial row and an overlapped one:
    the serial row's decode, the chosen prefill's TTFT; ``derive(batch, prompt, output_len, ttft_ms, decode_ms)``
    recomputes the tokens/s."""
    out = []
    for impl in dict.fromkeys(r["impl"] for r in rows):
        mine = [r for r in rows if r["impl"] == impl and r.get("status") == "ok"]
        serial = next((r for r in mine if r["schedule"] == "serial"), None)
        candidates = [r for r in mine if r["schedule"] in OVERLAPPED]
        if serial is None or not candidates:
            continue
        prefill, reason = choose_prefill(serial, candidates)
        row = {**serial, **{k: prefill[k] for k in TTFT_COLUMNS if k in prefill}, "schedule": "phased",
               "measured_order": "", "data_paths": "",
               "prefill_schedule": prefill["schedule"], "decode_schedule": "serial",
               "phase_reason": f"prefill {reason}; decode serial (an overlap of a step reads every weight again)"}
        row["calls_ok"] = serial["calls_ok"] and prefill["calls_ok"]
        if prefill["logits_ok"] is False:  # the reference's rows have no verdict ("")
            row["logits_ok"] = False
        row.update(derive(row["batch"], row["prompt_len"], row["output_len"], row["ttft_ms"], row["decode_ms"]))
        out.append(row)
    return out
