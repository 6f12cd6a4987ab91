"""`dmacoll probe <name>`: the GPU probes behind the experiments' explanations (``dmacoll_lab.bench.probes``), one
sub-command each, every table written with its provenance sidecar; a probe's further tables (sm_carveout's GEMM
cost) go in run folders beside ``--out``'s (``probes/sm_carveout_gemm_cost/data.csv``)."""
from __future__ import annotations

import argparse

from .common import add_out


def cmd_probe(a: argparse.Namespace) -> int:
    from ..bench import harness
    from ..bench.probes import table_path, tables
    from ..bench.probes.common import require_gpus

    probe = a.probe_module
    require_gpus(probe.GPUS, probe.NAME)
    columns = tables(probe)
    for name, (rows, config) in probe.run(a).items():
        harness.write(table_path(a.out, probe.NAME, name), rows, columns[name], config)
    return 0


def register(sub) -> None:
    from ..bench.probes import PROBES

    p = sub.add_parser("probe", help="one GPU probe: copy paths, flag latency, SM carveouts, cuMemcpyBatchAsync, ...",
                       description="GPU probes, one per sub-command; `dmacoll probe NAME --help` says what each "
                                   "measures and takes.")
    names = p.add_subparsers(dest="probe", required=True, metavar="name")
    for name, probe in PROBES.items():
        s = names.add_parser(name, help=probe.HELP, description=probe.__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
        probe.add_arguments(s)
        add_out(s, f"results/local/probes/{name}/data.csv")  # more tables: run folders beside it (table_path)
        s.set_defaults(func=cmd_probe, probe_module=probe)
