"""The README's library example, exactly as written, on the GPUs (one process per GPU, the cuda backend)."""
import pytest
import torch

from test_readme_example import PRINTED, example, expected, run, world_of

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(torch.cuda.device_count() < world_of(example()[0]),
                    reason="needs a GPU per rank: the README's example joins NCCL, which refuses two ranks on one GPU")
def test_the_readme_example_runs_as_written_on_gpus(tmp_path):
    command, code, _ = example()
    done = run(command, code, tmp_path, gpus=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(PRINTED.findall(done.stdout)) == expected(world_of(command), "cuda"), done.stdout
