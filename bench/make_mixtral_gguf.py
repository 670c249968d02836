#!/usr/bin/env python3
"""Makes the Mixtral-shaped benchmark model for the llama.cpp baseline (bench/cpu_vs_llama_cpp.sh)
as GGUF files in .deps/bench-models/ (never committed; ~6 GB in all):

  mixtral-1.3b-hf/             the Hugging Face checkpoint: MixtralForCausalLM.save_pretrained,
                               bf16 safetensors in the hub's per-expert w1/w2/w3 layout, plus the
                               real Mixtral-8x7B sentencepiece tokenizer.model (32,000 pieces,
                               from scripts/fetch_tokenizer.sh), which convert_hf_to_gguf.py wants
  mixtral-1.3b-bf16.gguf       llama.cpp's convert_hf_to_gguf.py --outtype bf16
  mixtral-1.3b-q8_0.gguf       llama-quantize ... Q8_0
  mixtral-1.3b-q4_k_m.gguf     llama-quantize ... Q4_K_M

Shape: hidden 2048, 4 layers, 32 heads / 8 KV heads (head_dim 64), 8 experts top-2 with
intermediate 5632, vocab 32000, untied lm_head: 1.28 B parameters (~0.39 B active per token).
Weights: normal(0, 0.02) (transformers' init with initializer_range 0.02, torch seed 0), norms 1.

Run with the venv that has torch + transformers (4.x, which writes the hub layout):
  .venv-fixtures/bin/python bench/make_mixtral_gguf.py
It needs scripts/fetch_llama_cpp.sh (convert script + llama-quantize) and runs
scripts/fetch_tokenizer.sh itself. Idempotent: skips what a stamp says is done.
About 5-10 minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
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
RECIPE = "1"


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


def make_hf(hf_dir: Path) -> None:
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    config = MixtralConfig(**CONFIG)
    t0 = time.time()
    model = MixtralForCausalLM(config)  # _init_weights: normal(0, initializer_range), norms 1
    model = model.to(torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    print(f"MixtralForCausalLM: {n / 1e9:.3f} B parameters ({time.time() - t0:.0f} s)")
    if hf_dir.exists():
        shutil.rmtree(hf_dir)
    model.save_pretrained(hf_dir, safe_serialization=True, max_shard_size="5GB")
    del model
    names = json.loads((hf_dir / "config.json").read_text())
    print(f"saved {hf_dir} ({names.get('torch_dtype') or names.get('dtype')})")


def main() -> None:
    deps = Path(os.environ.get("MOEBATCH_DEPS_DIR", ROOT / ".deps"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=deps / "bench-models")
    ap.add_argument("--llama-cpp", type=Path, default=deps / "llama.cpp")
    ap.add_argument("--keep-hf", action="store_true", help="keep the 2.6 GB HF checkpoint")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    convert = args.llama_cpp / "llama.cpp/convert_hf_to_gguf.py"
    quantize = args.llama_cpp / "bin/llama-quantize"
    for p in (convert, quantize, args.llama_cpp / "version"):
        if not p.exists():
            sys.exit(f"{p} missing: run scripts/fetch_llama_cpp.sh")
    # what made the files: llama.cpp's version (convert_hf_to_gguf.py, llama-quantize)
    llama_version = (args.llama_cpp / "version").read_text().strip()

    hf_dir = args.out / f"{NAME}-hf"
    bf16 = args.out / f"{NAME}-bf16.gguf"
    s_bf16 = stamp_of(RECIPE, json.dumps(CONFIG, sort_keys=True), llama_version, "bf16")
    if not done(bf16, s_bf16):
        make_hf(hf_dir)
        run(["bash", ROOT / "scripts/fetch_tokenizer.sh", hf_dir])
        t0 = time.time()
        # NO_LOCAL_GGUF unset: the script puts the gguf-py next to it first on sys.path.
        run([sys.executable, convert, hf_dir, "--outtype", "bf16", "--outfile", bf16])
        print(f"converted in {time.time() - t0:.0f} s")
        mark(bf16, s_bf16)
        if not args.keep_hf:
            shutil.rmtree(hf_dir)
    for q in QUANTS:
        out = args.out / f"{NAME}-{q.lower()}.gguf"
        s = stamp_of(s_bf16, q)
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
