import os
import random

import pytest

# Every test that starts ranks keeps NVLink multicast off (shared GPU hosts).
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

SEED_VARIABLE = "DMACOLL_TEST_SEED"  # set it to replay a failed randomized test with the seed it printed


def fresh_seed() -> int:
    """A seed for a test's random data: $DMACOLL_TEST_SEED when set (replay), else a fresh one."""
    value = os.environ.get(SEED_VARIABLE)
    return int(value) if value else random.randrange(1 << 30)


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
        report.sections.append(("seed", f"replay with {SEED_VARIABLE}={seeds[-1]}"))
