rule e2e:
    """LLM inference (Llama / Mixtral layer slices, random weights): TTFT, decode step, tokens/s with NCCL
    vs dmacoll collectives, logits compared (GPUs)."""
    output:
        csv=f"{OUT}/e2e/e2e/data.csv",
        json=f"{OUT}/e2e/e2e/data.json",
    log:
        f"{OUT}/e2e/e2e/run.log",
    benchmark:
        "benchmarks/e2e.tsv"
    threads: GPU_RANKS
    resources:
        **GPU_JOB,
    params:
        rule="e2e",
        py=PY,
        args=cli_flags("e2e"),
    conda:
        "../../envs/cuda.yaml"
    shell:
        "export DMACOLL_WORKFLOW_RULE={params.rule}; "
        "{params.py} -m dmacoll_lab e2e {params.args} --out {output.csv} 2>&1 | tee {log}"


rule e2e_phased:
    """One model's e2e run with every configured schedule (a schedule per phase), at every GPU of the machine."""
    output:
        csv=f"{OUT}/e2e/phased_tp{{world}}_{{model}}_run{{n}}/data.csv",
        json=f"{OUT}/e2e/phased_tp{{world}}_{{model}}_run{{n}}/data.json",
    wildcard_constraints:
        world="[0-9]+",
        model="[a-z0-9.x-]+",
        n="[0-9]+",
    log:
        f"{OUT}/e2e/phased_tp{{world}}_{{model}}_run{{n}}/run.log",
    benchmark:
        "benchmarks/e2e_phased_tp{world}_{model}_run{n}.tsv"
    threads: GPU_RANKS
    resources:
        **GPU_JOB,
    params:
        rule="e2e_phased",
        py=PY,
        args=e2e_phased_args,
    conda:
        "../../envs/cuda.yaml"
    shell:
        "export DMACOLL_WORKFLOW_RULE={params.rule}; "
        "{params.py} -m dmacoll_lab e2e --world {wildcards.world} {params.args} "
        "--out {output.csv} 2>&1 | tee {log}"


if VLLM_ON:

    rule vllm_model:
        """A dummy-weight model folder: config.json (e2e's shapes, maybe fewer layers) and a synthetic tokenizer."""
        output:
            directory(f"{OUT}/vllm/models/{{model}}"),
        wildcard_constraints:
            model="|".join(VLLM_MODELS),
        log:
            f"{OUT}/vllm/models/{{model}}.log",
        params:
            py=VLLM_PY,
            flags=vllm_model_flags,
        conda:
            "../../envs/vllm.yaml"
        shell:
            "{params.py} -m dmacoll_lab vllm model {output} {params.flags} > {log} 2>&1"

    rule vllm_bench:
        """One `vllm bench latency|throughput` run, dummy weights, with (dma) or without (vllm) the plugin;
        beside vLLM's JSON its settings, vLLM's all-reduce backends and what the plugin routed (.meta.json)."""
        input:
            model=lambda wc: f"{OUT}/vllm/models/{VLLM_RUNS[wc.run].model}",
            after=vllm_previous,
        output:
            json=f"{OUT}/vllm/bench/raw/{{run}}.json",
            meta=f"{OUT}/vllm/bench/raw/{{run}}.meta.json",
        wildcard_constraints:
            run="|".join(VLLM_RUNS),
        log:
            f"{OUT}/vllm/bench/raw/{{run}}.log",
        benchmark:
            "benchmarks/vllm_{run}.tsv"
        threads: GPU_RANKS
        resources:
            **GPU_JOB,
        params:
            rule="vllm_bench",
            py=VLLM_PY,
            flags=lambda wc: vllm_runs.cli_flags(VLLM_RUNS[wc.run]),
        conda:
            "../../envs/vllm.yaml"
        shell:
            "export DMACOLL_WORKFLOW_RULE={params.rule}; "
            "{params.py} -m dmacoll_lab vllm bench --model-dir {input.model} --out-json {output.json} "
            "{params.flags} > {log} 2>&1"

    rule vllm_results:
        """Every vLLM run as one tidy CSV (a row per metric) with provenance."""
        input:
            expand(f"{OUT}/vllm/bench/raw/{{run}}.json", run=VLLM_RUNS),
        output:
            csv=f"{OUT}/vllm/bench/data.csv",
            json=f"{OUT}/vllm/bench/data.json",
        log:
            f"{OUT}/vllm/bench/run.log",
        params:
            rule="vllm_results",
            py=PY,
        conda:
            "../../envs/cpu.yaml"
        shell:
            "export DMACOLL_WORKFLOW_RULE={params.rule}; "
            "{params.py} -m dmacoll_lab vllm results csv --out {output.csv} {input} "
            "> {log} 2>&1"
