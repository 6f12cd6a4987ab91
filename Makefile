# Two entry points (see README): `make artifact` runs the workflow, `make test` the tests.
# Both create the virtual environment .venv first (once; again when pyproject.toml changes).
VENV      ?= .venv
PY        := $(VENV)/bin/python
# CPU machines take torch 2.13.0 (a CPU wheel where one is on local disk); GPU machines keep
# their own CUDA torch >= 2.11: `make TORCH='torch>=2.11' EXTRAS=cuda,workflow,test artifact`.
TORCH     ?= torch==2.13.0
EXTRAS    ?= workflow,test
CORES     ?= 2
# GPU rules ask for every GPU (resources: gpu=N); declaring what the machine has keeps them from overlapping
GPUS      ?= $(shell nvidia-smi -L 2>/dev/null | wc -l)
STAMP     := $(VENV)/.installed
# what `make artifact` runs snakemake with (tests/test_workflow.py reads it: make -s snakemake-flags);
# --rerun-incomplete: a run stopped by Ctrl-C leaves incomplete-output markers that would stop the next one
SNAKEMAKE_FLAGS = --cores $(CORES) --resources gpu=$(GPUS) --printshellcmds --rerun-incomplete

.PHONY: setup artifact test test-gpu dryrun clean snakemake-flags

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check '$(TORCH)'
	$(PY) -m pip install -q --disable-pip-version-check -e '.[$(EXTRAS)]'
	touch $@

artifact: $(STAMP)
	$(VENV)/bin/snakemake $(SNAKEMAKE_FLAGS)

snakemake-flags:
	@echo $(SNAKEMAKE_FLAGS)

# what `make artifact` would run (after an interrupted run too)
dryrun: $(STAMP)
	$(VENV)/bin/snakemake $(SNAKEMAKE_FLAGS) --dry-run

test: $(STAMP)
	$(PY) -m pytest -q

# on a machine with 2 GPUs
test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu tests/gpu

clean:
	rm -rf results/local logs benchmarks .snakemake
