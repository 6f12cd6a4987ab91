import os
import random

import pytest

# Every test that starts ranks keeps NVLink multicast off (shared GPU hosts).
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
# Tests put dmacoll's cache where they want it through XDG_CACHE_HOME (or set DMACOLL_CACHE themselves); a caller's
# DMACOLL_CACHE would win over theirs (cache_dir.directory) and hand them the caller's tables and cubins.
os.environ.pop("DMACOLL_CACHE", None)

SEED_VARIABLE = "DMACOLL_TEST_SEED"  # set it to replay a failed randomized test with the seed it printed


def fresh_seed() -> int:
    """A seed for a test's random data: $DMACOLL_TEST_SEED when set (replay), else a fresh one."""
    value = os.environ.get(SEED_VARIABLE)
    if not value:
        return random.randrange(1 << 30)
    if not value.strip().isdigit():  # numpy takes no negative seed
        raise ValueError(f"{SEED_VARIABLE}={value!r}: a seed is a non-negative integer (the one a failed test named)")
    return int(value)


@pytest.fixture
def seed(request) -> int:
    """A test's seed (``fresh_seed``); a failure's report names it and how to replay it."""
    value = fresh_seed()
    request.node.user_properties.append(("seed", value))
    return value


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    seeds = [v for k, v in item.user_properties if k == "seed"]
    if report.failed and seeds:
        replay = f"replay with {SEED_VARIABLE}={seeds[-1]}"
        report.sections.append(("seed", replay))
        crash = getattr(report.longrepr, "reprcrash", None)
        if crash is not None:  # the short summary line too (-ra: what a CI log keeps of a failure)
            crash.message = f"[{replay}] {crash.message}"  # first: a narrow terminal trims the end


# `make test-quick` leaves these out (-m "not slow"): the modules whose tests start many rank processes at worlds up
# to 8, render notebooks or run the workflow (each took 5-37 s a test on 2 cores, 2026-11-27); the full suite, which
# CI runs, keeps them
SLOW_MODULES = {
    "test_a2av_stress", "test_bench_host", "test_calibration", "test_driver_fallback", "test_e2e",
    "test_e2e_schedules", "test_host_emulator", "test_misuse", "test_random_trials", "test_readme_example",
    "test_report_pages", "test_slurm_cluster", "test_toy_collective", "test_uneven_splits", "test_vllm_bench",
    "test_waits", "test_workflow",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module.__name__.rsplit(".", 1)[-1] in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
