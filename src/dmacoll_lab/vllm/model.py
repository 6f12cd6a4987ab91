"""A model folder vLLM can serve with dummy weights and no download: ``config.json`` (the shapes of
``e2e/config.py``, optionally fewer layers) and a synthetic tokenizer made with ``tokenizers`` from the config's
vocabulary size.

    dmacoll vllm model OUT_DIR --model llama-3.1-8b [--layers N] [--weights]

The tokenizer is a word-level one: token ``i`` is the word ``t<i>`` (``<unk>``, ``<s>``, ``</s>`` at the ids the
config names), words split on whitespace, decoded joined by spaces, so encode(decode(ids)) == ids: what
``vllm bench throughput --dataset-name random`` needs (it samples ids, decodes them to a prompt, encodes again).

``--weights`` also writes ``model.safetensors``: seeded random weights in Hugging Face's names, scaled like a
trained model (normal, std 1/sqrt(fan-in); norms 1), for the output checks (``dmacoll vllm check``). vLLM's own
dummy weights (uniform in +-1e-3, norms included) make every logit nearly equal, so outputs compared under them
would agree even with a wrong sum.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from ..e2e import config

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


def weight_shapes(spec) -> dict[str, tuple[int, ...]]:
    """Hugging Face parameter name -> shape for ``spec`` (LlamaForCausalLM / MixtralForCausalLM)."""
    h, d, i = spec.hidden, spec.head_dim, spec.intermediate
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (spec.vocab, h), "model.norm.weight": (h,),
                                          "lm_head.weight": (spec.vocab, h)}
    for n in range(spec.layers):
        p = f"model.layers.{n}."
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                       p + "self_attn.q_proj.weight": (spec.heads * d, h),
                       p + "self_attn.k_proj.weight": (spec.kv_heads * d, h),
                       p + "self_attn.v_proj.weight": (spec.kv_heads * d, h),
                       p + "self_attn.o_proj.weight": (h, spec.heads * d)})
        if spec.moe:
            shapes[p + "block_sparse_moe.gate.weight"] = (spec.experts, h)
            for e in range(spec.experts):
                q = f"{p}block_sparse_moe.experts.{e}."
                shapes.update({q + "w1.weight": (i, h), q + "w3.weight": (i, h), q + "w2.weight": (h, i)})
        else:
            shapes.update({p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                           p + "mlp.down_proj.weight": (h, i)})
    return shapes


def write_weights(out: str | Path, name: str, layers: Optional[int] = None, seed: int = 0, device: str = "cpu") -> Path:
    """``out``/model.safetensors: seeded random weights (bf16) for model ``name`` (module docstring)."""
    import torch
    from safetensors.torch import save_file

    spec = config.spec(name, layers)
    g = torch.Generator(device=device).manual_seed(seed)
    tensors = {}
    for key, shape in weight_shapes(spec).items():
        if len(shape) == 1:  # RMSNorm scales
            tensors[key] = torch.ones(shape, dtype=torch.bfloat16)
            continue
        w = torch.randn(shape, generator=g, device=device, dtype=torch.float32) / shape[1] ** 0.5
        tensors[key] = w.to(torch.bfloat16).cpu()
    path = Path(out) / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path
