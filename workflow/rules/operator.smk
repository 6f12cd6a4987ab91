OP = config["operator"]


rule operator_sweep:
    """nccl-tests-style sweep of every implementation (GPUs)."""
    output:
        csv=f"{OUT}/operator/sweep.csv",
        json=f"{OUT}/operator/sweep.json",
    log:
        "logs/operator_sweep.log",
    benchmark:
        "benchmarks/operator_sweep.tsv"
    resources:
        gpu=2,
    params:
        impls=" ".join(i for i in OP["impls"] if i != "nccl_ce"),
        ops=" ".join(OP["ops"]),
        modes=" ".join(OP["modes"]),
    shell:
        "{PY} -m dmacoll sweep --ops {params.ops} --impls {params.impls} --modes {params.modes} "
        "--min-bytes {OP[min_bytes]} --max-bytes {OP[max_bytes]} --repeats {OP[repeats]} --calls {OP[calls]} "
        "--out {output.csv} 2>&1 | tee {log}"


rule operator_sweep_nccl_ce:
    """NCCL's copy-engine path, alone in its processes (it switches torch's symmetric-memory backend)."""
    output:
        csv=f"{OUT}/operator/nccl_ce.csv",
        json=f"{OUT}/operator/nccl_ce.json",
    log:
        "logs/operator_sweep_nccl_ce.log",
    resources:
        gpu=2,
    params:
        ops=" ".join(OP["ops"]),
        modes=" ".join(OP["modes"]),
    shell:
        "{PY} -m dmacoll sweep --ops {params.ops} --impls nccl_ce --modes {params.modes} "
        "--min-bytes {OP[min_bytes]} --max-bytes {OP[max_bytes]} --repeats {OP[repeats]} --calls {OP[calls]} "
        "--out {output.csv} 2>&1 | tee {log}"
