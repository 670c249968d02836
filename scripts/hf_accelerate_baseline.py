#!/usr/bin/env python3
"""The issue-6 baseline: Hugging Face transformers with accelerate offloading on the same model
shape, GPU budget and prompts as bench_pipeline_throughput, for the side-by-side in
docs/performance.md.

    python3 scripts/hf_accelerate_baseline.py --config bench/models/mixtral-8x7b/config.json \
        --layers 8 --gpu_memory_gb 16 --requests 256 --prompt_tokens 98 --gen_tokens 32 \
        --batch 64

Random bf16 weights (transformers' own initialisation) in a Mixtral of --layers layers; placed with
accelerate's infer_auto_device_map / dispatch_model under max_memory {GPU: --gpu_memory_gb, cpu:
--cpu_memory_gb} (the layers that do not fit stay in CPU memory and run through accelerate's
offload hooks); prompts of random token ids, --prompt_tokens +- 25%, left-padded, generated in
batches of --batch with greedy decoding and exactly --gen_tokens new tokens each. Prints the
generated tokens per second over the whole job as one JSON line.

Needs a CUDA GPU and torch, transformers and accelerate (the GPU host's PyTorch; `pip install
accelerate` if missing). Written for the GPU host: it has not run on the machines without one.
"""
import argparse
import json
import random
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="bench/models/mixtral-8x7b/config.json")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--gpu_memory_gb", type=float, default=16)
    parser.add_argument("--cpu_memory_gb", type=float, default=100)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--prompt_tokens", type=int, default=98)
    parser.add_argument("--gen_tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    try:
        import torch
        from accelerate import dispatch_model, infer_auto_device_map
        from transformers import MixtralConfig, MixtralForCausalLM
    except ImportError as e:
        print(f"hf_accelerate_baseline: {e} (needs torch, transformers, accelerate)", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("hf_accelerate_baseline: no CUDA GPU", file=sys.stderr)
        return 1

    with open(args.config) as f:
        raw = json.load(f)
    raw["num_hidden_layers"] = args.layers
    config = MixtralConfig(**{k: v for k, v in raw.items() if k not in ("architectures",)})
    torch.manual_seed(args.seed)
    # Built in bf16 directly (random init of an 8-layer Mixtral-8x7B in f32 would take 45 GB and
    # minutes of CPU time before the job starts); the job's clock starts after placement.
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = MixtralForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default_dtype)
    device_map = infer_auto_device_map(
        model,
        max_memory={0: f"{args.gpu_memory_gb}GiB", "cpu": f"{args.cpu_memory_gb}GiB"},
        no_split_module_classes=["MixtralDecoderLayer"],
        dtype=torch.bfloat16,
    )
    model = dispatch_model(model, device_map=device_map)
    on_gpu = sum(1 for d in device_map.values() if d == 0)

    rng = random.Random(args.seed)
    low, high = max(1, args.prompt_tokens * 3 // 4), args.prompt_tokens * 5 // 4
    prompts = [[config.bos_token_id] + [rng.randrange(3, config.vocab_size)
                                        for _ in range(rng.randint(low, high) - 1)]
               for _ in range(args.requests)]
    pad = config.eos_token_id
    generated = 0
    start = time.perf_counter()
    for i in range(0, len(prompts), args.batch):
        chunk = prompts[i:i + args.batch]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk], device="cuda:0")
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device="cuda:0")
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                 max_new_tokens=args.gen_tokens, min_new_tokens=args.gen_tokens,
                                 pad_token_id=pad)
        generated += (out.shape[1] - width) * len(chunk)
    seconds = time.perf_counter() - start
    print(json.dumps({
        "system": "transformers+accelerate", "layers": args.layers,
        "gpu_memory_gb": args.gpu_memory_gb, "modules_on_gpu": on_gpu,
        "requests": args.requests, "prompt_tokens": args.prompt_tokens,
        "gen_tokens": args.gen_tokens, "batch": args.batch,
        "generated_tokens": generated, "seconds": round(seconds, 3),
        "generated_tokens_per_s": round(generated / seconds, 2),
        "gpu": torch.cuda.get_device_name(0)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
