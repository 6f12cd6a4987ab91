# Two entry points (see README): `make artifact` runs the workflow, `make test` the tests.
# Both create the virtual environment .venv first (once; again when either pyproject.toml changes).
VENV      ?= .venv
PY        := $(VENV)/bin/python
# CPU machines take torch 2.13.0 (a CPU wheel where one is on local disk); GPU machines keep
# their own CUDA torch >= 2.11: `make TORCH='torch>=2.11' LIB_EXTRAS=cuda artifact`.
# Two distributions from this repository: dmacoll (the library, pyproject.toml; LIB_EXTRAS) and dmacoll-lab (the
# artifact, lab/pyproject.toml; EXTRAS), both installed editable.
TORCH     ?= torch==2.13.0
LIB_EXTRAS ?=
EXTRAS    ?= workflow,test
LIB       = $(if $(LIB_EXTRAS),'.[$(LIB_EXTRAS)]',.)
CORES     ?= 2
# GPU rules ask for every GPU (resources: gpu=N); declaring what the machine has keeps them from overlapping
GPUS      ?= $(shell nvidia-smi -L 2>/dev/null | wc -l)
STAMP     := $(VENV)/.installed
# what `make artifact` runs snakemake with (tests/test_workflow.py reads it: make -s snakemake-flags);
# --rerun-incomplete: a run stopped by Ctrl-C leaves incomplete-output markers that would stop the next one
SNAKEMAKE_FLAGS = --cores $(CORES) --resources gpu=$(GPUS) --printshellcmds --rerun-incomplete

# The vLLM plugin's tests against a real vLLM, in a venv of their own (vLLM pins its torch): one of
# vLLM 0.27 - 0.32, which pin torch 2.13.0, the CPU wheel of TORCH. 0.26.0 (torch 2.11) is tested on the GPU
# machines (tools/vllm_gpu_run.sh). No test may skip there (the JUnit report is checked).
VLLM_VENV ?= .venv-vllm
VLLM_CI   ?= vllm==0.32.0
VLLM_TESTS = tests/test_vllm_plugin.py tests/test_vllm_model.py tests/test_vllm_check.py
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: setup artifact test test-quick test-gpu test-vllm test-slurm dryrun clean snakemake-flags

setup: $(STAMP)

$(STAMP): pyproject.toml lab/pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check '$(TORCH)'
	$(PY) -m pip install -q --disable-pip-version-check -e $(LIB) -e './lab[$(EXTRAS)]'
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

# a few minutes on 2 cores: every test but the slow modules of tests/conftest.py (SLOW_MODULES); CI runs `make test`
test-quick: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not gpu"

# vLLM without its GPU-only requirements (kernels, NVIDIA libraries, codecs: the venv took 2.8 GB instead of 6 on a
# CPU machine; a CI machine ran out of disk installing them): vLLM and what would pull them with --no-deps, then the
# rest (tests/vllm_requirements.py)
$(VLLM_STAMP): pyproject.toml lab/pyproject.toml Makefile tests/vllm_requirements.py
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check '$(TORCH)' packaging
	$(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check --no-deps '$(VLLM_CI)'
	$(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check --no-deps \
		$$($(VLLM_VENV)/bin/python tests/vllm_requirements.py --no-deps)
	$(VLLM_VENV)/bin/python tests/vllm_requirements.py > $(VLLM_VENV)/requirements.txt
	$(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check -r $(VLLM_VENV)/requirements.txt
	$(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check -e . -e './lab[test]'
	touch $@

test-vllm: $(VLLM_STAMP)
	DMACOLL_REQUIRE_VLLM=1 $(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider \
		--junitxml=$(VLLM_VENV)/junit.xml $(VLLM_TESTS)
	grep -q 'skipped="0"' $(VLLM_VENV)/junit.xml || { echo "test-vllm: a vLLM test was skipped"; exit 1; }

# The workflow through a real one-node SLURM cluster of this machine (tests/test_slurm_cluster.py: config/host.yaml
# via profiles/slurm, against a local run) and both cluster profiles against the executor plugin's own rules
# (tests/test_slurm_profiles.py). Installs Debian's SLURM and munge where missing (root; elsewhere it fails) and the
# plugin (the slurm extra). No test may skip there (the JUnit report is checked).
SLURM_TESTS = tests/test_slurm_profiles.py tests/test_slurm_cluster.py
SLURM_STAMP := $(VENV)/.slurm-installed

$(SLURM_STAMP): $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -e $(LIB) -e './lab[$(EXTRAS),slurm]'
	touch $@

test-slurm: $(SLURM_STAMP)
	tests/slurm_install.sh
	DMACOLL_REQUIRE_SLURM=1 $(PY) -m pytest -q -p no:cacheprovider --junitxml=$(VENV)/slurm-junit.xml $(SLURM_TESTS)
	grep -q 'skipped="0"' $(VENV)/slurm-junit.xml || { echo "test-slurm: a SLURM test was skipped"; exit 1; }

# on a machine with 2 GPUs
test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu tests/gpu

clean:
	rm -rf results/local logs benchmarks .snakemake $(VLLM_VENV)
