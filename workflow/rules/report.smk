import json


rule notebook:
    """A notebook executed with papermill on its CSVs (figures + tables), and an HTML page without code."""
    input:
        nb="notebooks/{name}.py",
        csvs=lambda wc: NOTEBOOK_INPUTS[wc.name](),
    output:
        ipynb=f"{OUT}/notebooks/{{name}}.ipynb",
        html=f"{OUT}/notebooks/{{name}}.html",
        figures=directory(f"{OUT}/figures/{{name}}"),
    wildcard_constraints:
        name="|".join(NOTEBOOK_INPUTS),
    params:
        parameters=lambda wc, input, output: json.dumps(
            {"csvs": list(input.csvs), "platform_label": config["label"], "outdir": output.figures}),
        stem=lambda wc: f"{OUT}/notebooks/{wc.name}",
    log:
        "logs/notebook_{name}.log",
    shell:
        "({PY} -m jupytext --to ipynb {input.nb} -o {params.stem}.src.ipynb && "
        "{PY} -m papermill {params.stem}.src.ipynb {output.ipynb} -y '{params.parameters}' --cwd . && "
        "{PY} -m jupyter nbconvert --to html --no-input {output.ipynb} --output-dir {OUT}/notebooks && "
        "rm {params.stem}.src.ipynb) > {log} 2>&1"


rule claims:
    """Each paper claim, the reproduced value, the tolerance and pass/fail."""
    input:
        sweeps=operator_csvs(),
        power=result("power/power.csv"),
    output:
        json=f"{OUT}/claims.json",
        md=f"{OUT}/claims.md",
    log:
        "logs/claims.log",
    shell:
        "{PY} -m dmacoll report claims --csv {input.sweeps} --power {input.power} --out {output.json} > {log} 2>&1; "
        "cat {log}"
