import json

# The report reads committed or fresh CSVs and renders them, seconds each: under a cluster executor it runs on the
# submitting host rather than waiting in the queue once per notebook.
localrules:
    notebook,
    claims,
    index,


rule notebook:
    """A notebook executed with papermill on its CSVs (figures + tables), and an HTML page without code."""
    input:
        nb="notebooks/{name}.py",
        csvs=lambda wc: NOTEBOOK_INPUTS[wc.name](wc.platform),
    output:
        ipynb=f"{REPORT}/{{platform}}/notebooks/{{name}}.ipynb",
        html=f"{REPORT}/{{platform}}/notebooks/{{name}}.html",
        figures=directory(f"{REPORT}/{{platform}}/figures/{{name}}"),
    wildcard_constraints:
        name="|".join(NOTEBOOK_INPUTS),
        platform="|".join(PLATFORMS),
    params:
        py=PY,
        parameters=lambda wc, input, output: json.dumps(
            {"csvs": list(input.csvs), "platform_label": PLATFORMS[wc.platform][1], "outdir": output.figures}),
        stem=lambda wc: f"{REPORT}/{wc.platform}/notebooks/{wc.name}",
        html_dir=lambda wc: f"{REPORT}/{wc.platform}/notebooks",
    log:
        "logs/notebook_{platform}_{name}.log",
    conda:
        "../../envs/cpu.yaml"
    shell:
        "({params.py} -m jupytext --to ipynb {input.nb} -o {params.stem}.src.ipynb && "
        "{params.py} -m papermill {params.stem}.src.ipynb {output.ipynb} -y '{params.parameters}' --cwd . && "
        "{params.py} -m jupyter nbconvert --to html --no-input {output.ipynb} --output-dir {params.html_dir} && "
        "rm {params.stem}.src.ipynb) > {log} 2>&1"


rule claims:
    """Each paper claim, the reproduced value, the tolerance and pass/fail."""
    input:
        sweeps=lambda wc: operator_csvs(wc.platform),
        # no power on the CPU; a shipped set may have none
        power=lambda wc: [] if EMULATED else [result(wc.platform, "power/power/data.csv")] if MEASURED
        else shipped_extra(wc.platform, "power/power/data.csv"),
        c3=lambda wc: c3_runs(wc.platform) if (wc.platform, "c3") in RENDERS else [],
        # the machine's full world (a claim's runs are repeats of one setting, not other worlds)
        e2e=lambda wc: e2e_claim_runs(wc.platform) if (wc.platform, "e2e") in RENDERS else [],
        ficco=lambda wc: NOTEBOOK_INPUTS["ficco"](wc.platform)
        if (wc.platform, "ficco") in RENDERS else [],
        vllm=lambda wc: vllm_claim_runs(wc.platform) if (wc.platform, "e2e") in RENDERS else [],
    output:
        json=f"{REPORT}/{{platform}}/claims.json",
        md=f"{REPORT}/{{platform}}/claims.md",
    wildcard_constraints:
        platform="|".join(CLAIMED),
    log:
        "logs/claims_{platform}.log",
    params:
        py=PY,
        power=lambda wc, input: f"--power {input.power}" if input.power else "",
        c3=lambda wc, input: f"--c3 {input.c3}" if input.c3 else "",
        e2e=lambda wc, input: f"--e2e {input.e2e}" if input.e2e else "",
        ficco=lambda wc, input: f"--ficco {input.ficco}" if input.ficco else "",
        vllm=lambda wc, input: f"--vllm {input.vllm}" if input.vllm else "",
    conda:
        "../../envs/cpu.yaml"
    shell:
        "{params.py} -m dmacoll_lab report claims --csv {input.sweeps} {params.power} {params.c3} {params.e2e} "
        "{params.ficco} {params.vllm} --out {output.json} "
        "> {log} 2>&1; "
        "cat {log}"


rule index:
    """The report's front page: every rendered notebook and each platform's claims."""
    input:
        pages=[f"{REPORT}/{platform}/notebooks/{name}.html" for platform, name in RENDERS],
        claims=expand(f"{REPORT}/{{platform}}/claims.json", platform=CLAIMED),
    output:
        f"{REPORT}/index.html",
    params:
        py=PY,
        platforms=" ".join(f"--platform {shlex.quote(n)} {shlex.quote(label)}" for n, (_, label) in PLATFORMS.items()),
    log:
        "logs/index.log",
    conda:
        "../../envs/cpu.yaml"
    shell:
        "{params.py} -m dmacoll_lab report index --report-dir $(dirname {output}) {params.platforms} --out {output} > {log} 2>&1"
