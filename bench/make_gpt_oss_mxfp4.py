#!/usr/bin/env python3
"""Writes a gpt-oss-20b-shaped checkpoint with random weights and MXFP4 experts, laid out as the
official openai/gpt-oss-* checkpoints are (mlp.experts.{gate_up,down}_proj_{blocks,scales}, U8;
quantization_config {"quant_method": "mxfp4"}; everything else bf16), to measure what moebatch holds
in memory for such a file (bench/gpt_oss_mxfp4_memory.sh).

gpt-oss-20b's shapes (bench/models/gpt-oss-20b/config.json: hidden 2880, 64 query heads over 8 KV
heads of 64, 32 experts top-4 of intermediate 2880, sinks, biases, alternating sliding layers) with
--layers of its 24 layers and Mixtral's 32,000-token vocabulary (the tokenizer.model that
scripts/fetch_tokenizer.sh copies; gpt-oss's 201,088-token embedding would only add bf16 bytes).
Random values: bf16 N(0, 0.02); MXFP4 nibbles uniform, E8M0 scales 2^-7 .. 2^-5 (weights within
+-0.19). One safetensors file, written by the safetensors package (torch tensors).

Usage (a venv with torch and safetensors, e.g. .venv-fixtures):
    make_gpt_oss_mxfp4.py --out DIR [--layers 4] [--seed 0]
"""
import argparse
import json
import os
import shutil

import numpy as np
import torch
from safetensors.torch import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bf16(rng, shape, std=0.02, mean=0.0):
    """Random N(mean, std) values in bf16."""
    x = rng.standard_normal(shape, dtype=np.float32) * std + mean
    return torch.from_numpy(x).to(torch.bfloat16)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with open(os.path.join(ROOT, "bench/models/gpt-oss-20b/config.json")) as f:
        config = json.load(f)
    n = args.layers
    config["num_hidden_layers"] = n
    config["layer_types"] = config["layer_types"][:n]
    config["vocab_size"] = 32000
    config["bos_token_id"], config["eos_token_id"] = 1, 2
    config.pop("pad_token_id", None)
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"]}
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads, hd = (config["num_attention_heads"], config["num_key_value_heads"],
                           config["head_dim"])
    experts, vocab = config["num_local_experts"], config["vocab_size"]
    rng = np.random.default_rng(args.seed)

    tensors = {}

    def put_bf16(name, shape, std=0.02, mean=0.0):
        tensors[name] = bf16(rng, shape, std, mean)

    put_bf16("model.embed_tokens.weight", (vocab, hidden))
    put_bf16("lm_head.weight", (vocab, hidden))
    put_bf16("model.norm.weight", (hidden,), 0.0, 1.0)
    for i in range(n):
        p = f"model.layers.{i}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            put_bf16(p + norm + ".weight", (hidden,), 0.0, 1.0)
        for proj, rows in (("q", heads * hd), ("k", kv_heads * hd), ("v", kv_heads * hd)):
            put_bf16(p + f"self_attn.{proj}_proj.weight", (rows, hidden))
            put_bf16(p + f"self_attn.{proj}_proj.bias", (rows,))
        put_bf16(p + "self_attn.o_proj.weight", (hidden, heads * hd))
        put_bf16(p + "self_attn.o_proj.bias", (hidden,))
        put_bf16(p + "self_attn.sinks", (heads,), 1.0)
        put_bf16(p + "mlp.router.weight", (experts, hidden))
        put_bf16(p + "mlp.router.bias", (experts,))
        # MXFP4: [E, out, in / 32, 16] nibble bytes and [E, out, in / 32] E8M0 scales.
        for name, out_dim, in_dim in (("gate_up_proj", 2 * inter, hidden),
                                      ("down_proj", hidden, inter)):
            tensors[p + f"mlp.experts.{name}_blocks"] = torch.from_numpy(rng.integers(
                0, 256, (experts, out_dim, in_dim // 32, 16), dtype=np.uint8))
            tensors[p + f"mlp.experts.{name}_scales"] = torch.from_numpy(rng.integers(
                120, 123, (experts, out_dim, in_dim // 32), dtype=np.uint8))
        put_bf16(p + "mlp.experts.gate_up_proj_bias", (experts, 2 * inter))
        put_bf16(p + "mlp.experts.down_proj_bias", (experts, hidden))

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "model.safetensors")
    save_file(tensors, path)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    tok = os.path.join(ROOT, "tests/fixtures/tiny-mixtral/tokenizer.model")
    if os.path.exists(tok):
        shutil.copy(tok, os.path.join(args.out, "tokenizer.model"))
    print(f"{path}: {os.path.getsize(path) / 2**20:.1f} MiB, {n} layers")


if __name__ == "__main__":
    main()
