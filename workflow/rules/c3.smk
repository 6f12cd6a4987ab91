rule c3:
    """C3 (ConCCL): a GEMM / memory-bound kernel next to each collective, per overlap strategy (GPUs)."""
    output:
        csv=f"{OUT}/c3/c3/data.csv",
        json=f"{OUT}/c3/c3/data.json",
    log:
        f"{OUT}/c3/c3/run.log",
    benchmark:
        "benchmarks/c3.tsv"
    threads: GPU_RANKS
    resources:
        **GPU_JOB,
    params:
        rule="c3",
        py=PY,
        args=cli_flags("c3"),
    conda:
        "../../envs/cuda.yaml"
    shell:
        "export DMACOLL_WORKFLOW_RULE={params.rule}; "
        "{params.py} -m dmacoll_lab c3 {params.args} --out {output.csv} 2>&1 | tee {log}"
