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
        rule="probe",
        py=PY,
        args=lambda wc: f" {config['probe_args'][wc.name]}" if config["probe_args"].get(wc.name) else "",
    conda:
        "../../envs/cuda.yaml"
    shell:
        "export DMACOLL_WORKFLOW_RULE={params.rule}; "
        "{params.py} -m dmacoll_lab probe {wildcards.name} --out {output.csv}{params.args} 2>&1 | tee {log}"


# Communicator()'s default call against NCCL, repeated (config default_call; DEFAULT_CALL_RUNS in common.smk).


rule default_call:
    """One run of one part of the default call's sizes, at every GPU of the machine."""
    output:
        csv=f"{OUT}/sm_path/default_call_{{part}}_run{{n}}/data.csv",
        json=f"{OUT}/sm_path/default_call_{{part}}_run{{n}}/data.json",
    wildcard_constraints:
        part="[a-z0-9_]+",
        n="[0-9]+",
    log:
        f"{OUT}/sm_path/default_call_{{part}}_run{{n}}/run.log",
    benchmark:
        "benchmarks/default_call_{part}_run{n}.tsv"
    threads: GPU_RANKS
    resources:
        **GPU_JOB,
    params:
        rule="default_call",
        py=PY,
        world=GPU_RANKS,
        args=default_call_args,
    conda:
        "../../envs/cuda.yaml"
    shell:
        "export DMACOLL_WORKFLOW_RULE={params.rule}; "
        "{params.py} -m dmacoll_lab probe sm_path --worlds {params.world} "
        "{params.args} --out {output.csv} 2>&1 | tee {log}"
