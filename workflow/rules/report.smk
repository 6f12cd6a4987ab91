import json


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
        parameters=lambda wc, input, output: json.dumps(
            {"csvs": list(input.csvs), "platform_label": PLATFORMS[wc.platform][1], "outdir": output.figures}),
        stem=lambda wc: f"{REPORT}/{wc.platform}/notebooks/{wc.name}",
        html_dir=lambda wc: f"{REPORT}/{wc.platform}/notebooks",
    log:
        "logs/notebook_{platform}_{name}.log",
    shell:
        "({PY} -m jupytext --to ipynb {input.nb} -o {params.stem}.src.ipynb && "
        "{PY} -m papermill {params.stem}.src.ipynb {output.ipynb} -y '{params.parameters}' --cwd . && "
        "{PY} -m jupyter nbconvert --to html --no-input {output.ipynb} --output-dir {params.html_dir} && "
        "rm {params.stem}.src.ipynb) > {log} 2>&1"


rule claims:
    """Each paper claim, the reproduced value, the tolerance and pass/fail."""
    input:
        sweeps=lambda wc: operator_csvs(wc.platform),
        power=lambda wc: result(wc.platform, "power/power.csv"),
    output:
        json=f"{REPORT}/{{platform}}/claims.json",
        md=f"{REPORT}/{{platform}}/claims.md",
    wildcard_constraints:
        platform="|".join(PLATFORMS),
    log:
        "logs/claims_{platform}.log",
    shell:
        "{PY} -m dmacoll report claims --csv {input.sweeps} --power {input.power} --out {output.json} > {log} 2>&1; "
        "cat {log}"
