rule ficco:
    """FiCCO: all-gather->GEMM, GEMM->reduce-scatter, all-to-all->GEMM, serial vs overlapped pieces (GPUs)."""
    output:
        csv=f"{OUT}/ficco/ficco/data.csv",
        json=f"{OUT}/ficco/ficco/data.json",
    log:
        f"{OUT}/ficco/ficco/run.log",
    benchmark:
        "benchmarks/ficco.tsv"
    threads: GPU_RANKS
    resources:
        **GPU_JOB,
    params:
        rule="ficco",
        py=PY,
        args=cli_flags("ficco"),
    conda:
        "../../envs/cuda.yaml"
    shell:
        "export DMACOLL_WORKFLOW_RULE={params.rule}; "
        "{params.py} -m dmacoll_lab ficco {params.args} --out {output.csv} 2>&1 | tee {log}"
