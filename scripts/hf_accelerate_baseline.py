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

--config_overrides takes a JSON object merged into the config file's keys after loading (before the
model is built, so derived sizes such as the head dimension follow), e.g. a tiny model for a smoke
run: '{"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
"num_key_value_heads": 2, "vocab_size": 1000}'.

Needs torch, transformers and accelerate (the GPU host's PyTorch; `pip install accelerate` if
missing); with the default --device cuda, a CUDA GPU.

--device cpu is a smoke run of this script's code path on a machine without a GPU, not a baseline
figure: no accelerate placement (nothing is dispatched, --gpu_memory_gb is ignored), the whole model
and the inputs stay in CPU memory, and the JSON line says "device": "cpu" and "gpu": null. Its
tokens per second measure nothing comparable; use it only to check that the script runs against the
installed torch / transformers / accelerate, e.g.

    python3 scripts/hf_accelerate_baseline.py --device cpu --layers 2 --requests 4 --batch 2 \
        --prompt_tokens 16 --gen_tokens 4 --config_overrides '{"hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 1000}'
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
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda: the baseline (accelerate placement under --gpu_memory_gb); "
                             "cpu: a smoke run of the code path without a GPU, not a baseline figure")
    parser.add_argument("--config_overrides", default=None,
                        help="JSON object merged into the config's keys after loading, e.g. "
                             "'{\"hidden_size\": 64, \"vocab_size\": 1000}' for a tiny smoke-run model")
    args = parser.parse_args()
    overrides = {}
    if args.config_overrides:
        try:
            overrides = json.loads(args.config_overrides)
        except json.JSONDecodeError as e:
            print(f"hf_accelerate_baseline: --config_overrides is not JSON: {e}", file=sys.stderr)
            return 1
        if not isinstance(overrides, dict):
            print("hf_accelerate_baseline: --config_overrides must be a JSON object", file=sys.stderr)
            return 1
    try:
        import torch
        from accelerate import dispatch_model, infer_auto_device_map
        from transformers import MixtralConfig, MixtralForCausalLM
    except ImportError as e:
        print(f"hf_accelerate_baseline: {e} (needs torch, transformers, accelerate)", file=sys.stderr)
        return 1
    if args.device == "cuda" and not torch.cuda.is_available():
        print("hf_accelerate_baseline: no CUDA GPU (--device cpu for a smoke run)", file=sys.stderr)
        return 1

    with open(args.config) as f:
        raw = json.load(f)
    raw["num_hidden_layers"] = args.layers
    raw.update(overrides)
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
    if args.device == "cuda":
        device_map = infer_auto_device_map(
            model,
            max_memory={0: f"{args.gpu_memory_gb}GiB", "cpu": f"{args.cpu_memory_gb}GiB"},
            no_split_module_classes=["MixtralDecoderLayer"],
            dtype=torch.bfloat16,
        )
        model = dispatch_model(model, device_map=device_map)
        on_gpu = sum(1 for d in device_map.values() if d == 0)
        input_device = "cuda:0"
    else:
        on_gpu = 0
        input_device = "cpu"

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
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk], device=input_device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk],
                            device=input_device)
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
        "device": args.device,
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
