rule c3:
    """C3 (ConCCL): a GEMM / memory-bound kernel next to each collective, per overlap strategy (GPUs); c3/c3 with the
    c3 section's flags, c3/<name> with config c3_extra's changes to them."""
    output:
        csv=f"{OUT}/c3/{{name}}/data.csv",
        json=f"{OUT}/c3/{{name}}/data.json",
    wildcard_constraints:
        name="[a-z0-9_]+",
    log:
        f"{OUT}/c3/{{name}}/run.log",
    benchmark:
        "benchmarks/c3_{name}.tsv"
    threads: GPU_RANKS
    resources:
        **GPU_JOB,
    params:
        rule="c3",
        py=PY,
        args=lambda wc: cli_flags("c3", over=c3_extra(wc.name)),
    conda:
        "../../envs/cuda.yaml"
    shell:
        "export DMACOLL_WORKFLOW_RULE={params.rule}; "
        "{params.py} -m dmacoll_lab c3 {params.args} --out {output.csv} 2>&1 | tee {log}"
