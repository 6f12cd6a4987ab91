OP = config["operator"]
GPUS = config["gpus"]


rule operator_sweep:
    """nccl-tests-style sweep of every implementation for one op (GPUs); one CSV per op."""
    input:
        native=lambda wc: ["build/native/libdmacoll_submit.so"] if "native" in OP["submit"] else [],
    output:
        csv=f"{OUT}/operator/sweep_{{op}}/data.csv",
        json=f"{OUT}/operator/sweep_{{op}}/data.json",
    wildcard_constraints:
        op="|".join(OP["ops"]),
    log:
        f"{OUT}/operator/sweep_{{op}}/run.log",
    benchmark:
        "benchmarks/operator_sweep_{op}.tsv"
    threads: GPU_RANKS
    resources:
        **GPU_JOB,
    params:
        rule="operator_sweep",
        py=PY,
        **{k: OP[k] for k in ("min_bytes", "max_bytes", "repeats", "calls")},
        impls=" ".join(i for i in OP["impls"] if i != "nccl_ce"),
        modes=" ".join(OP["modes"]),
        signals=" ".join(OP["signals"]),
        waits=" ".join(OP["waits"]),
        prerecord=" ".join(OP["prerecord"]),
        submit=" ".join(OP["submit"]),
        handshakes=" ".join(OP["handshakes"]),
        backend=f"--backend host --world {GPUS}" if EMULATED else "",  # CPU ranks, one per GPU asked for
    conda:
        "../../envs/cuda.yaml"
    shell:
        "export DMACOLL_WORKFLOW_RULE={params.rule}; "
        "{params.py} -m dmacoll_lab sweep {params.backend} --ops {wildcards.op} --impls {params.impls} "
        "--modes {params.modes} "
        "--signals {params.signals} --waits {params.waits} --prerecord {params.prerecord} --submit {params.submit} "
        "--handshakes {params.handshakes} "
        "--min-bytes {params.min_bytes} --max-bytes {params.max_bytes} --repeats {params.repeats} --calls {params.calls} "
        "--out {output.csv} 2>&1 | tee {log}"


rule operator_sweep_nccl_ce:
    """NCCL's copy-engine path, alone in its processes (it switches torch's symmetric-memory backend)."""
    output:
        csv=f"{OUT}/operator/nccl_ce/data.csv",
        json=f"{OUT}/operator/nccl_ce/data.json",
    log:
        f"{OUT}/operator/nccl_ce/run.log",
    benchmark:
        "benchmarks/operator_sweep_nccl_ce.tsv"
    threads: GPU_RANKS
    resources:
        **GPU_JOB,
    params:
        rule="operator_sweep_nccl_ce",
        py=PY,
        **{k: OP[k] for k in ("min_bytes", "max_bytes", "repeats", "calls")},
        ops=" ".join(OP["ops"]),
        modes=" ".join(OP["modes"]),
    conda:
        "../../envs/cuda.yaml"
    shell:
        "export DMACOLL_WORKFLOW_RULE={params.rule}; "
        "{params.py} -m dmacoll_lab sweep --ops {params.ops} --impls nccl_ce --modes {params.modes} "
        "--min-bytes {params.min_bytes} --max-bytes {params.max_bytes} --repeats {params.repeats} --calls {params.calls} "
        "--out {output.csv} 2>&1 | tee {log}"


rule breakdown:
    """Control / schedule / copy / sync of one peer copy (CUPTI timestamps), one process."""
    output:
        csv=f"{OUT}/breakdown/breakdown/data.csv",
        json=f"{OUT}/breakdown/breakdown/data.json",
    log:
        f"{OUT}/breakdown/breakdown/run.log",
    benchmark:
        "benchmarks/breakdown.tsv"
    resources:
        **GPU_JOB,
    params:
        rule="breakdown",
        py=PY,
        args=cli_flags("breakdown"),
    conda:
        "../../envs/cuda.yaml"
    shell:
        "export DMACOLL_WORKFLOW_RULE={params.rule}; "
        "{params.py} -m dmacoll_lab breakdown {params.args} --out {output.csv} 2>&1 | tee {log}"


rule power:
    """Power/energy (NVML), kernels vs copies per call (profiler), interference with compute (GPUs)."""
    output:
        power=f"{OUT}/power/power/data.csv",
        sm_usage=f"{OUT}/power/sm_usage/data.csv",
        interference=f"{OUT}/power/interference/data.csv",
    log:
        power=f"{OUT}/power/power/run.log",
        sm_usage=f"{OUT}/power/sm_usage/run.log",
        interference=f"{OUT}/power/interference/run.log",
    benchmark:
        "benchmarks/power.tsv"
    threads: GPU_RANKS
    resources:
        **GPU_JOB,
    params:
        rule="power",
        py=PY,
        sizes=" ".join(config["resources"]["power_sizes"]),
        power=cli_flags("power"),
        sm_usage=cli_flags("sm_usage"),
        interference=cli_flags("interference"),
    conda:
        "../../envs/cuda.yaml"
    shell:
        "export DMACOLL_WORKFLOW_RULE={params.rule}; "
        "{params.py} -m dmacoll_lab power --sizes {params.sizes} {params.power} --out {output.power} 2>&1 "
        "| tee {log.power} && "
        "{params.py} -m dmacoll_lab sm-usage {params.sm_usage} --out {output.sm_usage} 2>&1 | tee {log.sm_usage} && "
        "{params.py} -m dmacoll_lab interference --sizes {params.sizes} {params.interference} "
        "--out {output.interference} 2>&1 | tee {log.interference}"


rule native_submit:
    """Eager copy-engine calls submitted from Python and from the native library, beside NCCL (NVIDIA; config
    native: dmacoll sweep flags)."""
    input:
        lib="build/native/libdmacoll_submit.so",
    output:
        csv=f"{OUT}/native/native/data.csv",
        json=f"{OUT}/native/native/data.json",
    log:
        f"{OUT}/native/native/run.log",
    benchmark:
        "benchmarks/native_submit.tsv"
    threads: GPU_RANKS
    resources:
        **GPU_JOB,
    params:
        rule="native_submit",
        py=PY,
        args=cli_flags("native"),
    conda:
        "../../envs/cuda.yaml"
    shell:
        "export DMACOLL_WORKFLOW_RULE={params.rule}; "
        "{params.py} -m dmacoll_lab sweep {params.args} --out {output.csv} 2>&1 | tee {log}"


rule check_cost:
    """What checking every call across the ranks costs (check_calls on / off), at the machine's GPUs."""
    output:
        csv=f"{OUT}/check_calls/check_cost/data.csv",
        json=f"{OUT}/check_calls/check_cost/data.json",
    log:
        f"{OUT}/check_calls/check_cost/run.log",
    benchmark:
        "benchmarks/check_cost.tsv"
    threads: GPU_RANKS
    resources:
        **GPU_JOB,
    params:
        rule="check_cost",
        py=PY,
        world=GPU_RANKS,
    conda:
        "../../envs/cuda.yaml"
    shell:
        "export DMACOLL_WORKFLOW_RULE={params.rule}; "
        "{params.py} -m dmacoll_lab check-cost --world {params.world} --out {output.csv} 2>&1 | tee {log}"
