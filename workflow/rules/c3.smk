import shlex

C3_CONFIG = config.get("c3", {})


def c3_args():
    """`dmacoll c3` flags from the config's c3 section; the CLI's defaults for what it leaves out."""
    flags = []
    for key, value in C3_CONFIG.items():
        values = value if isinstance(value, list) else [value]
        flags += [f"--{key.replace('_', '-')}", *map(str, values)]
    return " ".join(shlex.quote(f) for f in flags)


rule c3:
    """C3 (ConCCL): a GEMM / memory-bound kernel next to each collective, per overlap strategy (GPUs)."""
    output:
        csv=f"{OUT}/c3/c3.csv",
        json=f"{OUT}/c3/c3.json",
    log:
        "logs/c3.log",
    benchmark:
        "benchmarks/c3.tsv"
    resources:
        gpu=config["gpus"],
    params:
        args=c3_args(),
    shell:
        "{PY} -m dmacoll c3 {params.args} --out {output.csv} 2>&1 | tee {log}"
