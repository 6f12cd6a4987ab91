"""Helpers of workflow/rules/e2e.smk (kept apart: the linter wants rules and functions in separate files)."""
VLLM = config.get("vllm", {})
VLLM_ON = GPU and bool(VLLM.get("enabled", False))  # vLLM runs only where asked for, on a GPU machine


def vllm_runs():
    """run name -> settings: `vllm bench latency` per (model, batch, input length) and `vllm bench
    throughput` per model, each with the dmacoll plugin (dma) and without it (vllm)."""
    runs = {}
    lat, thr = VLLM.get("latency", {}), VLLM.get("throughput", {})
    for m in VLLM.get("models", []):
        for plugin in ("dma", "vllm"):
            for batch in lat.get("batches", [1, 8, 32]):
                for inp in lat.get("input_lens", [128]):
                    runs[f"latency_{m['name']}_b{batch}_i{inp}_{plugin}"] = dict(
                        bench="latency", m=m, plugin=plugin, batch=batch, input_len=inp,
                        output_len=lat.get("output_len", 128))
            runs[f"throughput_{m['name']}_{plugin}"] = dict(
                bench="throughput", m=m, plugin=plugin, num_prompts=thr.get("num_prompts", 200),
                input_len=thr.get("input_len", 128), output_len=thr.get("output_len", 128))
    return runs


def vllm_command(r):
    m = r["m"]
    args = [VLLM.get("bin", "vllm"), "bench", r["bench"], "--model", m["model"], "--load-format", "dummy",
            "--tensor-parallel-size", str(m.get("tp", config["gpus"]))]
    if m.get("ep"):
        args.append("--enable-expert-parallel")
    if m.get("dp"):
        args += ["--data-parallel-size", str(m["dp"])]
    if r["bench"] == "latency":
        lat = VLLM.get("latency", {})
        args += ["--batch-size", r["batch"], "--input-len", r["input_len"], "--output-len", r["output_len"],
                 "--num-iters-warmup", lat.get("warmup", 3), "--num-iters", lat.get("iters", 10)]
    else:
        args += ["--dataset-name", "random", "--num-prompts", r["num_prompts"], "--input-len", r["input_len"],
                 "--output-len", r["output_len"]]
    args += m.get("args", []) + VLLM.get("args", [])
    env = ["env", "NCCL_NVLS_ENABLE=0", "TORCH_SYMM_MEM_DISABLE_MULTICAST=1", "NVSHMEM_DISABLE_NVLS=1",
           f"DMACOLL_VLLM={1 if r['plugin'] == 'dma' else 0}"]
    return " ".join(shlex.quote(str(a)) for a in env + args)


def vllm_meta(r):
    """key=value settings written beside the result (vLLM's JSON does not record them)."""
    m = r["m"]
    meta = {"bench": r["bench"], "model": m["model"], "tp": m.get("tp", config["gpus"]), "ep": bool(m.get("ep")),
            "plugin": r["plugin"], **{k: r[k] for k in ("batch", "input_len", "output_len", "num_prompts") if k in r}}
    return " ".join(shlex.quote(f"{k}={v}") for k, v in meta.items())


VLLM_RUNS = vllm_runs() if VLLM_ON else {}
