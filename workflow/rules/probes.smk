# GPU probes (`dmacoll probe <name>`), run when the config lists them (probes: [...]); nothing is requested by
# default, and on a machine without GPUs the list is set aside (a probe there would only say it needs one).
PROBE_RUNS = config["probes"] if GPU else []
if config["probes"] and not GPU:
    print(f"dmacoll workflow: no GPU here, probes {config['probes']} not run", file=sys.stderr)


rule probe:
    """One GPU probe into its run folder (sm_carveout also writes probes/sm_carveout_gemm_cost/)."""
    output:
        csv=f"{OUT}/probes/{{name}}/data.csv",
        json=f"{OUT}/probes/{{name}}/data.json",
    wildcard_constraints:
        name="[a-z_]+",
    log:
        f"{OUT}/probes/{{name}}/run.log",
    benchmark:
        "benchmarks/probe_{name}.tsv"
    threads: GPU_RANKS
    resources:
        **GPU_JOB,
    params:
        py=PY,
    conda:
        "../../envs/cuda.yaml"
    shell:
        "{params.py} -m dmacoll_lab probe {wildcards.name} --out {output.csv} 2>&1 | tee {log}"
