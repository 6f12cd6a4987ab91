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
    resources:
        gpu=config["gpus"],
    params:
        py=PY,
        args=cli_flags("e2e"),
    conda:
        "../../envs/cuda.yaml"
    shell:
        "{params.py} -m dmacoll e2e {params.args} --out {output.csv} 2>&1 | tee {log}"


if VLLM_ON:

    rule vllm_bench:
        """One `vllm bench latency|throughput` run, dummy weights, with (dma) or without (vllm) the plugin."""
        output:
            json=f"{OUT}/e2e/vllm/bench/{{run}}.json",
            meta=f"{OUT}/e2e/vllm/bench/{{run}}.meta.json",
        wildcard_constraints:
            run="|".join(VLLM_RUNS),
        log:
            f"{OUT}/e2e/vllm/bench/{{run}}.log",
        benchmark:
            "benchmarks/vllm_{run}.tsv"
        resources:
            gpu=config["gpus"],
        params:
            py=PY,
            vllm=VLLM.get("bin", "vllm"),
            cmd=lambda wc: vllm_command(VLLM_RUNS[wc.run]),
            meta=lambda wc: vllm_meta(VLLM_RUNS[wc.run]),
        conda:
            "../../envs/vllm.yaml"
        shell:
            "({params.py} -m dmacoll vllm-results meta --out {output.meta} {params.meta} "
            "vllm_version=$({params.vllm} --version 2>/dev/null | tail -n 1) && "
            "{params.cmd} --output-json {output.json}) > {log} 2>&1"

    rule vllm_results:
        """Every vLLM run as one tidy CSV (a row per metric) with provenance."""
        input:
            expand(f"{OUT}/e2e/vllm/bench/{{run}}.json", run=VLLM_RUNS),
        output:
            csv=f"{OUT}/e2e/vllm/data.csv",
            json=f"{OUT}/e2e/vllm/data.json",
        log:
            f"{OUT}/e2e/vllm/run.log",
        params:
            py=PY,
        conda:
            "../../envs/cpu.yaml"
        shell:
            "{params.py} -m dmacoll vllm-results csv --out {output.csv} {input} > {log} 2>&1"
