# dmacoll artifact workflow. `make artifact` runs it; see README.
# On a machine without GPUs it renders the tables from every shipped reference result set;
# on an NVIDIA machine it runs the experiments first and renders from the fresh results.
from snakemake.utils import min_version, validate

from dmacoll_lab import workflow_config

min_version("9.0")

configfile: "config/config.yaml"
validate(config, "workflow/schemas/config.schema.yaml")
workflow_config.check(config)  # the collective names: the op registry's, not a copy in the schema

include: "workflow/rules/common.smk"
include: "workflow/rules/build.smk"
include: "workflow/rules/check.smk"
include: "workflow/rules/operator.smk"
include: "workflow/rules/c3.smk"
include: "workflow/rules/ficco.smk"
include: "workflow/rules/probes.smk"
include: "workflow/rules/e2e_functions.smk"
include: "workflow/rules/e2e.smk"
if DMALATTE_ON:
    include: "workflow/rules/amd_dmalatte.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        "build/native/toolchain.json",
        f"{OUT}/check/host_w{config['host_check']['world']}.txt",
        f"{REPORT}/index.html",
        [f"{OUT}/probes/{name}/data.csv" for name in PROBE_RUNS],
        DEFAULT_CALL_RUNS,
        E2E_PHASED_RUNS,
        CHECK_COST_RUNS,


# Each page's measurements as a target of its own, `snakemake measure_<page>` (operator, speedup, breakdown, resources,
# c3, ficco, e2e; measure_probes, measure_check_cost): on a lent machine, whose commands run at most 10 minutes,
# one at a time (tools/lent_snakemake.sh); `all` measures everything and renders
if GPU:
    for _page, _inputs in NOTEBOOK_INPUTS.items():
        rule:
            name: f"measure_{_page}"
            input: _inputs("measured")

    rule measure_probes:
        input: [f"{OUT}/probes/{name}/data.csv" for name in PROBE_RUNS]

    rule measure_check_cost:
        input: CHECK_COST_RUNS
