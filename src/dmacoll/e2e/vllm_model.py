"""A model folder vLLM can serve with dummy weights and no download: ``config.json`` (the shapes of
``e2e/config.py``, optionally fewer layers) and a synthetic tokenizer made with ``tokenizers`` from the config's
vocabulary size.

    dmacoll vllm-model OUT_DIR --model llama-3.1-8b [--layers N]

The tokenizer is a word-level one: token ``i`` is the word ``t<i>`` (``<unk>``, ``<s>``, ``</s>`` at the ids the
config names), words split on whitespace, decoded joined by spaces, so encode(decode(ids)) == ids: what
``vllm bench throughput --dataset-name random`` needs (it samples ids, decodes them to a prompt, encodes again).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from . import config

SPECIAL = {0: "<unk>", 1: "<s>", 2: "</s>"}  # hf_config: bos_token_id 1, eos_token_id 2


def vocabulary(size: int) -> dict[str, int]:
    if size <= len(SPECIAL):
        raise ValueError(f"a vocabulary needs more than {len(SPECIAL)} tokens, got {size}")
    return {SPECIAL.get(i, f"t{i}"): i for i in range(size)}


def tokenizer(size: int):
    """A ``tokenizers.Tokenizer`` of ``size`` tokens (needs the ``tokenizers`` package: vLLM brings it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocabulary(size), unk_token=SPECIAL[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with one space, changes nothing else
    tok.add_special_tokens(list(SPECIAL.values()))
    return tok


def write(out: str | Path, name: str, layers: Optional[int] = None) -> Path:
    """``out``/config.json, tokenizer.json, tokenizer_config.json for model ``name`` (``config.MODELS``)."""
    spec = config.spec(name, layers)
    hf = config.hf_config(spec)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf, indent=1) + "\n")
    tokenizer(hf["vocab_size"]).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": SPECIAL[0], "bos_token": SPECIAL[1],
        "eos_token": SPECIAL[2], "model_max_length": hf["max_position_embeddings"],
        "clean_up_tokenization_spaces": False}, indent=1) + "\n")
    return folder
