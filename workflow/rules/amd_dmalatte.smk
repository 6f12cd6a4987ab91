rule amd_dmalatte_build:
    """Build the authors' AMD-DMA-Latte checkout named in the config (ROCm) and record its commit."""
    output:
        f"{OUT}/amd_dmalatte/build.txt",
    params:
        checkout=DMALATTE["checkout"],
        make=DMALATTE["make"],
    log:
        "logs/amd_dmalatte_build.log",
    conda:
        "../../envs/rocm.yaml"
    shell:
        "(cd {params.checkout} && {params.make}) > {log} 2>&1 && "
        "git -C {params.checkout} rev-parse HEAD > {output} && echo '{params.make}' >> {output}"


rule amd_dmalatte_sweep:
    """One configured sdma_collective run (a variant), its stdout parsed into the sweep's tidy CSV."""
    input:
        f"{OUT}/amd_dmalatte/build.txt",
    output:
        stdout=f"{OUT}/amd_dmalatte/{{run}}/stdout.txt",
        csv=f"{OUT}/amd_dmalatte/{{run}}/data.csv",
    wildcard_constraints:
        run="|".join(DMALATTE["runs"]) or "none",
    params:
        rule="amd_dmalatte_sweep",
        py=PY,
        checkout=DMALATTE["checkout"],
        command=lambda wc: DMALATTE["runs"][wc.run]["command"],
        op=lambda wc: DMALATTE["runs"][wc.run]["op"],
        variant=lambda wc: DMALATTE["runs"][wc.run]["variant"],
        world=config["gpus"],
    threads: GPU_RANKS
    resources:
        **GPU_JOB,
    log:
        f"{OUT}/amd_dmalatte/{{run}}/run.log",
    conda:
        "../../envs/rocm.yaml"
    shell:
        "export DMACOLL_WORKFLOW_RULE={params.rule}; "
        "(cd {params.checkout} && {params.command}) > {output.stdout} 2> {log} && "
        "{params.py} -m dmacoll_lab amd-dmalatte {output.stdout} {output.csv} --world {params.world} "
        "--op {params.op} --variant '{params.variant}' >> {log} 2>&1"
