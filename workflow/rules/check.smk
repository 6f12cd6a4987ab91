rule host_check:
    """Every op x variant x direction x dtype on the host emulator (CPU, one process per rank)."""
    output:
        f"{OUT}/check/host_w{{world}}.txt",
    log:
        "logs/host_check_w{world}.log",
    benchmark:
        "benchmarks/host_check_w{world}.tsv"
    threads: lambda wc: int(wc.world)  # one process per rank
    resources:
        mem_mb=lambda wc: HOST_RANK_MB * (int(wc.world) + 1),
    params:
        py=PY,
    conda:
        "../../envs/cpu.yaml"
    shell:
        "{params.py} -m dmacoll_lab check --backend host --world {wildcards.world} > {output} 2> {log}; "
        "tail -n 1 {output}"
