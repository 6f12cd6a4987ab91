"""dmacoll_lab: the research artifact around the dmacoll library: benchmarks (bench/), end-to-end inference (e2e/),
the vLLM tooling (vllm/), the analysis and report (analysis/), correctness checks and the rank launcher (verify/),
and the `dmacoll` command line (cli/). It needs the `lab` extra (pandas, pyyaml, packaging); the library does not."""
