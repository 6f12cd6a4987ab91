"""The dummy-weight model folders for `vllm bench`: config.json from e2e's shapes, a synthetic tokenizer that
round-trips, read by vLLM's own config, tokenizer and random-dataset code (where vLLM is installed)."""
import importlib.util
import json
import os

import numpy as np
import pytest

from dmacoll_lab.e2e import config
from dmacoll_lab.vllm import model as vllm_model

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
REQUIRE = bool(os.environ.get("DMACOLL_REQUIRE_VLLM"))  # make test-vllm: run, never skip
needs_tokenizers = pytest.mark.skipif(importlib.util.find_spec("tokenizers") is None and not REQUIRE,
                                      reason="tokenizers is not installed here (make test-vllm runs this)")
needs_vllm = pytest.mark.skipif(not HAVE_VLLM and not REQUIRE,
                                reason="vLLM is not installed here (make test-vllm runs these)")


def test_vocabulary_has_the_special_ids_the_config_names():
    vocab = vllm_model.vocabulary(40)
    assert len(vocab) == len(set(vocab.values())) == 40 and sorted(vocab.values()) == list(range(40))
    hf = config.hf_config(config.spec("mixtral-8x7b", 2))
    assert vocab["<s>"] == hf["bos_token_id"] and vocab["</s>"] == hf["eos_token_id"] and vocab["t39"] == 39
    with pytest.raises(ValueError, match="more than 3"):
        vllm_model.vocabulary(3)


@needs_tokenizers
@pytest.mark.parametrize("name,layers", [("llama-3.1-8b", None), ("llama-3.1-70b", 3), ("mixtral-8x7b", 1)])
def test_folder_round_trips_random_ids(tmp_path, name, layers, seed):
    folder = vllm_model.write(tmp_path / name, name, layers)
    hf = json.loads((folder / "config.json").read_text())
    assert hf == config.hf_config(config.spec(name, layers))
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert tok.get_vocab_size() == hf["vocab_size"]
    ids = np.random.default_rng(seed).integers(3, hf["vocab_size"], size=200).tolist()
    text = tok.decode(ids)
    assert tok.encode(text).ids == ids and len(text.split()) == len(ids), f"seed {seed}"


@needs_vllm
def test_vllm_reads_the_folder_and_samples_its_random_dataset(tmp_path):
    """What `vllm bench ... --load-format dummy` and the random dataset do with the folder, on vLLM's code."""
    from vllm.transformers_utils.config import get_config

    folder = vllm_model.write(tmp_path / "m", "llama-3.1-70b", 2)
    hf = get_config(str(folder), trust_remote_code=False)
    assert hf.architectures == ["LlamaForCausalLM"] and hf.num_hidden_layers == 2 and hf.vocab_size == 128256
    from vllm.benchmarks.datasets import RandomDataset
    from vllm.tokenizers import get_tokenizer

    tok = get_tokenizer(str(folder))
    assert tok.vocab_size == 128256 and tok.eos_token_id == 2
    requests = RandomDataset(random_seed=3).sample(tokenizer=tok, num_requests=4, input_len=96, output_len=8,
                                                  range_ratio=0.0)
    assert len(requests) == 4
    for r in requests:
        assert r.prompt_len == 96 and r.expected_output_len == 8
        assert len(tok(r.prompt, add_special_tokens=False).input_ids) == 96  # re-encodes to the same length


@needs_vllm
@pytest.mark.parametrize("bench", ["latency", "throughput"])
def test_vllms_own_benchmark_parsers_take_the_runs_arguments(bench, tmp_path):
    """Every planned run's arguments, parsed by the parser `vllm bench <bench>` builds (no GPU, no run)."""
    from dmacoll_lab.vllm import entry as vllm_entry, runs as vllm_runs

    runs = [r for r in vllm_runs.plan({}, gpus=4).values() if r.bench == bench]
    assert runs
    for r in runs[:: max(1, len(runs) // 6)]:
        _, args = vllm_entry.parse(bench, r.vllm_args(str(tmp_path)) + ["--output-json", str(tmp_path / "x.json")])
        assert args.model == str(tmp_path) and args.load_format == "dummy" and args.tensor_parallel_size == r.tp
        assert args.enable_expert_parallel == r.ep and args.max_model_len == r.max_model_len
        assert (args.batch_size == r.batch) if bench == "latency" else (args.dataset_name == "random"
                                                                        and args.num_prompts == r.num_prompts)
