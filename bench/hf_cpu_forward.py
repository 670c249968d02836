#!/usr/bin/env python3
"""The peer of bench_engine_throughput on the CPU: Hugging Face transformers running the same
model slice, batch and phases, for the side-by-side in docs/performance.md.

    .venv-fixtures/bin/python bench/hf_cpu_forward.py --config bench/models/qwen3-30b-a3b/config.json \
        --layers 4 --batch 64 --prompt_tokens 128 --gen_tokens 16 --dtype bfloat16 --threads 2

Random weights (transformers' own initialisation) in a model built from --config with
num_hidden_layers = --layers, eager attention, in --dtype. Prefill: the --batch prompts of
--prompt_tokens random token ids in one forward (logits of the last position only, as the engine
asks; best of --reps after a warm-up). Decode: --gen_tokens forwards of one token per sequence over
the DynamicCache the prefill filled (what model.generate does per step, without sampling). Prints
one JSON line: tokens/s of each phase and the process's peak RSS (GiB).
"""
import argparse
import json
import resource
import time

import torch
import transformers


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt_tokens", type=int, default=128)
    ap.add_argument("--gen_tokens", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--reps", type=int, default=1)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    config = transformers.AutoConfig.from_pretrained(args.config)
    config.num_hidden_layers = args.layers
    if hasattr(config, "mlp_only_layers"):
        config.mlp_only_layers = [l for l in config.mlp_only_layers if l < args.layers]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        config, dtype=dtype, attn_implementation="eager").eval()
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, config.vocab_size, (args.batch, args.prompt_tokens), generator=gen)

    def prefill():
        cache = transformers.DynamicCache()
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.past_key_values

    with torch.inference_mode():
        prefill()  # warm-up
        best = float("inf")
        for _ in range(args.reps):
            t0 = time.perf_counter()
            cache = prefill()
            best = min(best, time.perf_counter() - t0)
        prefill_tps = args.batch * args.prompt_tokens / best
        step = torch.randint(3, config.vocab_size, (args.batch, 1), generator=gen)
        t0 = time.perf_counter()
        for _ in range(args.gen_tokens):
            out = model(input_ids=step, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            step = out.logits[:, -1:].argmax(-1)
        decode_s = time.perf_counter() - t0
    print(json.dumps({
        "peer": f"transformers {transformers.__version__} (torch {torch.__version__})",
        "model": args.config, "layers": args.layers, "dtype": args.dtype,
        "threads": torch.get_num_threads(), "batch": args.batch,
        "prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens,
        "prefill_seconds": round(best, 4), "prefill_tokens_per_s": round(prefill_tps, 1),
        "decode_seconds": round(decode_s, 4),
        "decode_tokens_per_s": round(args.batch * args.gen_tokens / decode_s, 1),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}))


if __name__ == "__main__":
    main()
