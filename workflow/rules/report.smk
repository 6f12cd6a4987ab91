rule operator_table:
    """dma vs NCCL ratios and the operator targets, as Markdown."""
    input:
        operator_csvs(),
    output:
        f"{OUT}/tables/operator.md",
    log:
        "logs/operator_table.log",
    shell:
        "{PY} -m dmacoll report table --csv {input} --out {output} > {log} 2>&1"
