import json


rule notebook_operator:
    """Latency / bandwidth figures and ratio tables (papermill), and an HTML page without code."""
    input:
        nb="notebooks/operator.py",
        csvs=operator_csvs(),
    output:
        ipynb=f"{OUT}/notebooks/operator.ipynb",
        html=f"{OUT}/notebooks/operator.html",
        figures=directory(f"{OUT}/figures/operator"),
    params:
        parameters=lambda wc, input, output: json.dumps(
            {"sweep_csvs": list(input.csvs), "platform_label": config["label"], "outdir": output.figures}),
        stem=f"{OUT}/notebooks/operator",
    log:
        "logs/notebook_operator.log",
    shell:
        "({PY} -m jupytext --to ipynb {input.nb} -o {params.stem}.src.ipynb && "
        "{PY} -m papermill {params.stem}.src.ipynb {output.ipynb} -y '{params.parameters}' --cwd . && "
        "{PY} -m jupyter nbconvert --to html --no-input {output.ipynb} --output-dir {OUT}/notebooks && "
        "rm {params.stem}.src.ipynb) > {log} 2>&1"


rule claims:
    """Each paper claim, the reproduced value, the tolerance and pass/fail."""
    input:
        operator_csvs(),
    output:
        json=f"{OUT}/claims.json",
        md=f"{OUT}/claims.md",
    log:
        "logs/claims.log",
    shell:
        "{PY} -m dmacoll report claims --csv {input} --out {output.json} > {log} 2>&1; cat {log}"
