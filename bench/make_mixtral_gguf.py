#!/usr/bin/env python3
"""Makes the Mixtral-shaped benchmark model for the llama.cpp baseline (bench/cpu_vs_llama_cpp.sh)
as GGUF files in .deps/bench-models/ (never committed; ~4.6 GB in all):

  mixtral-1.3b-bf16.gguf       written here with gguf-py's GGUFWriter, in the layout llama.cpp's
                               convert_hf_to_gguf.py gives a Mixtral checkpoint (architecture
                               "llama" with expert_count; the experts of a layer merged into
                               blk.N.ffn_{gate,up,down}_exps; norms and the router f32), with the
                               real Mixtral-8x7B sentencepiece vocabulary (32,000 pieces, from
                               scripts/fetch_tokenizer.sh) as its tokenizer.ggml.* keys
  mixtral-1.3b-q8_0.gguf       llama-quantize ... Q8_0
  mixtral-1.3b-q4_k_m.gguf     llama-quantize ... Q4_K_M

Shape: hidden 2048, 4 layers, 32 heads / 8 KV heads (head_dim 64), 8 experts top-2 with
intermediate 5632, vocab 32000, untied lm_head: 1.28 B parameters (~0.39 B active per token).
Weights: normal(0, 0.02) (numpy's default_rng(0); the distribution of transformers' init with
initializer_range 0.02), norms 1. The q/k weights are random, so they are written directly in
GGUF's RoPE layout (no permutation from the Hugging Face one is needed).

Run with a venv holding gguf, numpy and sentencepiece (cpu_vs_llama_cpp.sh uses .deps/venv-hf,
scripts/pinned_venv.sh's HF_VENV_PACKAGES; no torch):
  .deps/venv-hf/bin/python bench/make_mixtral_gguf.py
It needs scripts/fetch_llama_cpp.sh (llama-quantize) and runs scripts/fetch_tokenizer.sh itself.
Idempotent: skips what a stamp says is done. About 3-6 minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAME = "mixtral-1.3b"
CONFIG = dict(
    vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=4,
    num_attention_heads=32, num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
    max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-5, hidden_act="silu",
    initializer_range=0.02, tie_word_embeddings=False, sliding_window=None,
    bos_token_id=1, eos_token_id=2,
)
QUANTS = ["Q8_0", "Q4_K_M"]
# Bump when the way the files are made changes (the stamps hold it, CONFIG and llama.cpp's version).
RECIPE = "2"


def stamp_of(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def done(path: Path, stamp: str) -> bool:
    s = path.with_name(path.name + ".stamp")
    return path.exists() and s.exists() and s.read_text().strip() == stamp


def mark(path: Path, stamp: str) -> None:
    path.with_name(path.name + ".stamp").write_text(stamp + "\n")


def run(cmd: list[str], **kw) -> None:
    print("+", " ".join(map(str, cmd)), flush=True)
    subprocess.run(list(map(str, cmd)), check=True, **kw)


def write_bf16(out: Path, tokenizer_model: Path) -> None:
    import gguf
    import numpy as np
    from gguf.vocab import SentencePieceVocab

    c = CONFIG
    hidden, inter, vocab = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    heads, kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
    head_dim = hidden // heads
    experts = c["num_local_experts"]
    rng = np.random.default_rng(0)
    t0 = time.time()

    def normal(*shape: int) -> np.ndarray:
        w = rng.standard_normal(shape, dtype=np.float32)
        w *= c["initializer_range"]
        return gguf.quants.quantize(w, gguf.GGMLQuantizationType.BF16)

    w = gguf.GGUFWriter(out, "llama")
    w.add_name(NAME)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_block_count(c["num_hidden_layers"])
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(c["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_expert_count(experts)
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)

    spm = SentencePieceVocab(tokenizer_model.parent)
    tokens, scores, types = zip(*spm.all_tokens())
    if len(tokens) != vocab:
        sys.exit(f"{tokenizer_model}: {len(tokens)} pieces, the model has {vocab}")
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(list(tokens))
    w.add_token_scores(list(scores))
    w.add_token_types(list(types))
    w.add_bos_token_id(c["bos_token_id"])
    w.add_eos_token_id(c["eos_token_id"])
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    bf16 = gguf.GGMLQuantizationType.BF16
    ones = np.ones(hidden, dtype=np.float32)
    w.add_tensor("token_embd.weight", normal(vocab, hidden), raw_dtype=bf16)
    for i in range(c["num_hidden_layers"]):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", ones)
        w.add_tensor(b + "attn_q.weight", normal(hidden, hidden), raw_dtype=bf16)
        w.add_tensor(b + "attn_k.weight", normal(kv_heads * head_dim, hidden), raw_dtype=bf16)
        w.add_tensor(b + "attn_v.weight", normal(kv_heads * head_dim, hidden), raw_dtype=bf16)
        w.add_tensor(b + "attn_output.weight", normal(hidden, hidden), raw_dtype=bf16)
        w.add_tensor(b + "ffn_norm.weight", ones)
        w.add_tensor(b + "ffn_gate_inp.weight",
                     rng.standard_normal((experts, hidden), dtype=np.float32) * np.float32(0.02))
        w.add_tensor(b + "ffn_gate_exps.weight", normal(experts, inter, hidden), raw_dtype=bf16)
        w.add_tensor(b + "ffn_down_exps.weight", normal(experts, hidden, inter), raw_dtype=bf16)
        w.add_tensor(b + "ffn_up_exps.weight", normal(experts, inter, hidden), raw_dtype=bf16)
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", normal(vocab, hidden), raw_dtype=bf16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {out} ({time.time() - t0:.0f} s)")


def main() -> None:
    deps = Path(os.environ.get("MOEBATCH_DEPS_DIR", ROOT / ".deps"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=deps / "bench-models")
    ap.add_argument("--llama-cpp", type=Path, default=deps / "llama.cpp")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    quantize = args.llama_cpp / "bin/llama-quantize"
    for p in (quantize, args.llama_cpp / "version"):
        if not p.exists():
            sys.exit(f"{p} missing: run scripts/fetch_llama_cpp.sh")
    # what made the quantized files: llama.cpp's version (llama-quantize)
    llama_version = (args.llama_cpp / "version").read_text().strip()

    bf16 = args.out / f"{NAME}-bf16.gguf"
    s_bf16 = stamp_of(RECIPE, json.dumps(CONFIG, sort_keys=True), "bf16")
    if not done(bf16, s_bf16):
        (args.out / "tokenizer").mkdir(exist_ok=True)
        run(["bash", ROOT / "scripts/fetch_tokenizer.sh", args.out / "tokenizer"])
        write_bf16(bf16, args.out / "tokenizer" / "tokenizer.model")
        mark(bf16, s_bf16)
    for q in QUANTS:
        out = args.out / f"{NAME}-{q.lower()}.gguf"
        s = stamp_of(s_bf16, llama_version, q)
        if not done(out, s):
            t0 = time.time()
            with open(out.with_name(out.name + ".log"), "w") as log:
                run(["nice", "-n", "10", quantize, bf16, out, q, "2"], stdout=log,
                    stderr=subprocess.STDOUT)
            print(f"quantized {q} in {time.time() - t0:.0f} s")
            mark(out, s)
    for f in sorted(args.out.glob(f"{NAME}-*.gguf")):
        print(f"{f}  {f.stat().st_size / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
