"""A tuning table for ``variant='auto'`` derived from a measured sweep (``dmacoll tune``)."""
from __future__ import annotations

from dmacoll.lab_api import Entry, InvalidArgument, TuningTable
from . import load, report


def derive(sweep_csvs: list[str], provenance: dict) -> TuningTable:
    """The fastest correct dma (variant, direction) per (op, mode, place, size) and combination of the options
    'auto' may choose (signal, wait, prerecord, submit) of a sweep. The handshake is the caller's: lean rows are
    left out."""
    df = report.load(sweep_csvs)
    dma = df[(df["impl"] == "dma") & df["ok"] & (df["handshake"] == "full")]
    if dma.empty:
        raise InvalidArgument(f"{sweep_csvs}: no correct dma rows to tune from (a sweep with --impls dma)")
    keys = ["op", "mode", "place", "signal", "wait", "prerecord", "submit", "bytes_per_rank"]
    idx = dma.groupby(keys)["time_us"].idxmin()
    entries = [Entry(r.op, r.mode, r.place, int(r.bytes_per_rank), r.variant, r.direction, float(r.time_us),
                     r.signal, r.wait, bool(r.prerecord), r.submit) for r in dma.loc[idx].itertuples()]
    if dma["world"].nunique() != 1:
        raise InvalidArgument(f"{sweep_csvs}: sweeps of worlds {sorted(dma['world'].unique())}; derive one table per "
                              "world")
    where = load.platform(provenance, int(dma["world"].iloc[0]))
    sources = [load.provenance(csv) for csv in sweep_csvs]
    for csv, prov in list(zip(sweep_csvs, sources))[1:]:  # one table, one platform: every source measured on it
        other = load.platform(prov, int(dma["world"].iloc[0]))
        if (other.gpu, other.topology) != (where.gpu, where.topology):
            raise InvalidArgument(f"{csv} was measured on {other.gpu} ({other.topology}), {sweep_csvs[0]} on "
                                  f"{where.gpu} ({where.topology}): derive one table per platform")
    meta = {"world": where.world, "gpu": where.gpu, "topology": where.topology, "driver": where.driver,
            "dtype": str(dma["dtype"].iloc[0]), "source": sweep_csvs, "source_git_sha": provenance.get("git_sha"),
            "source_created_utc": provenance.get("created_utc"),
            # each source's code (sweeps of different ops may come from different commits and leases)
            "source_git_shas": [prov.get("git_sha") for prov in sources]}
    return TuningTable(meta, entries)
