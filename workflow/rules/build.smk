rule build:
    """Compile the native submission library (submit='native'), self-test it through recording
    doubles of the driver entry points, and record the toolchain."""
    input:
        "src/dmacoll/csrc/dmacoll_submit.c",
    output:
        lib="build/native/libdmacoll_submit.so",
        toolchain="build/native/toolchain.json",
    log:
        "logs/build.log",
    benchmark:
        "benchmarks/build.tsv"
    params:
        py=PY,
    conda:
        "../../envs/cpu.yaml"
    shell:
        "{params.py} -m dmacoll_lab build --out build/native > {log} 2>&1; rc=$?; cat {log}; exit $rc"
