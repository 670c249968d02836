#!/usr/bin/env python3
"""llama.cpp serving a batch JSONL of chat prompts: the baseline of the demo's throughput.

Runs the requests of an OpenAI batch file (scripts/make_prompt_set.py: /v1/chat/completions lines
with messages, max_tokens, temperature 0) through llama.cpp's C API (llama-cpp-python's ctypes
bindings over the libraries scripts/fetch_llama_cpp.sh builds) with continuous batching, the way
llama-server's slots run them: --parallel slots, each with its own f16 KV cache of --kv_gb /
parallel (llama-server's default, no --kv-unified: a sequence attends over its own cells only; with
--kv_unified one cache of --kv_gb is shared and a request is admitted when its prompt plus
max_tokens fit beside those of the running ones, but every sequence's attention then spans the
whole cache); each step one llama_decode over one token of every sequence decoding and the next
prompt tokens of the sequences being admitted (up to n_batch of them); greedy (argmax of the logits) until an
end-of-generation token or max_tokens. Prompts are laid out by the GGUF's chat template
(tokenizer.chat_template rendered with Jinja, as llama.cpp does by default) and tokenized by
llama.cpp, so moebatch and llama.cpp prefill the same token ids (tests/integration/test_gguf.py).

Prints one JSON object: requests, prompt and generated tokens, seconds (first decode to last
token, after the model is loaded), generated and total tokens/s, peak RSS (getrusage, bytes).

Usage (with .deps/venv-llama/bin/python):
  bench/llama_cpp_serve_prompts.py --model FILE.gguf --prompts FILE.jsonl [--threads 2]
      [--parallel 64] [--kv_gb 2] [--kv_unified]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import resource
import sys
import time
from collections import deque

import llama_cpp
import numpy as np
from llama_cpp.llama_chat_format import Jinja2ChatFormatter


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True, help="batch JSONL (/v1/chat/completions lines)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=64, help="slots: sequences decoded together")
    ap.add_argument("--kv_gb", type=float, default=2.0, help="KV cache, GiB (f16), all slots")
    ap.add_argument("--kv_unified", action="store_true", help="one KV cache shared by the slots")
    ap.add_argument("--n_batch", type=int, default=2048, help="tokens per llama_decode at most")
    args = ap.parse_args()

    requests = []
    with open(args.prompts) as f:
        for line in f:
            r = json.loads(line)
            body = r["body"]
            if body.get("temperature", 1.0) != 0:
                print(f"{r['custom_id']}: only greedy (temperature 0) requests", file=sys.stderr)
                return 1
            requests.append((r["custom_id"], body["messages"], int(body.get("max_tokens", 16))))

    # The model and tokenizer through the high-level class; the batched context through the C API.
    llm = llama_cpp.Llama(args.model, n_ctx=512, n_threads=args.threads,
                          n_threads_batch=args.threads, n_gpu_layers=0, verbose=False)
    model = llm.model
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
    formatter = Jinja2ChatFormatter(
        llm.metadata["tokenizer.chat_template"],
        eos_token=llm.detokenize([llama_cpp.llama_vocab_eos(vocab)], special=True).decode(),
        bos_token=llm.detokenize([llama_cpp.llama_vocab_bos(vocab)], special=True).decode())
    head_dim = llama_cpp.llama_model_n_embd(model) // llama_cpp.llama_model_n_head(model)
    kv_bytes_per_token = (llama_cpp.llama_model_n_layer(model) * 2 *
                          llama_cpp.llama_model_n_head_kv(model) * head_dim * 2)
    kv_tokens = int(args.kv_gb * 2**30 // kv_bytes_per_token) // (256 * args.parallel) * (
        256 * args.parallel)
    per_seq = kv_tokens if args.kv_unified else kv_tokens // args.parallel
    prompts = []
    for cid, messages, max_tokens in requests:
        ids = llm.tokenize(formatter(messages=messages).prompt.encode(), add_bos=add_bos,
                           special=True)
        if len(ids) + max_tokens > per_seq:
            print(f"{cid}: {len(ids)} prompt + {max_tokens} tokens exceed a slot's KV cache "
                  f"({per_seq} tokens)", file=sys.stderr)
            return 1
        prompts.append((ids, max_tokens))

    params = llama_cpp.llama_context_default_params()
    params.n_ctx = kv_tokens
    params.n_batch = args.n_batch + args.parallel  # prompt tokens + one per decoding sequence
    params.n_ubatch = min(512, args.n_batch)
    params.n_seq_max = args.parallel
    params.kv_unified = args.kv_unified
    params.n_threads = args.threads
    params.n_threads_batch = args.threads
    params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO
    ctx = llama_cpp.llama_init_from_model(model, params)
    if not ctx:
        print("llama_init_from_model failed", file=sys.stderr)
        return 1
    memory = llama_cpp.llama_get_memory(ctx)
    batch = llama_cpp.llama_batch_init(args.n_batch + args.parallel, 0, 1)

    queue = deque(range(len(prompts)))
    free_slots = list(range(args.parallel - 1, -1, -1))
    # slot -> [request, next position, prompt tokens not yet fed, generated count, last token]
    active: dict[int, list] = {}
    prompt_tokens = generated = 0
    reserved = 0  # KV tokens the running requests may reach (prompt + max_tokens)
    t0 = last_report = time.time()
    while queue or active:
        if time.time() - last_report >= 30:
            last_report = time.time()
            done = len(prompts) - len(queue) - len(active)
            print(f"llama.cpp: {done}/{len(prompts)} done, {generated} tokens generated, "
                  f"{generated / (last_report - t0):.1f} tok/s", file=sys.stderr, flush=True)
        n = 0
        rows: list[tuple[int, int]] = []  # (batch row with logits, slot)

        def add(token: int, pos: int, slot: int, logits: bool) -> None:
            nonlocal n
            batch.token[n], batch.pos[n], batch.n_seq_id[n] = token, pos, 1
            batch.seq_id[n][0] = slot
            batch.logits[n] = logits
            if logits:
                rows.append((n, slot))
            n += 1

        for slot, s in active.items():  # one token of every decoding sequence
            if not s[2]:
                add(s[4], s[1], slot, True)
                s[1] += 1
        budget = args.n_batch
        for slot, s in active.items():  # the rest of prompts being admitted
            if s[2]:
                take, s[2] = s[2][:budget], s[2][budget:]
                for i, tok in enumerate(take):
                    add(tok, s[1] + i, slot, not s[2] and i == len(take) - 1)
                s[1] += len(take)
                budget -= len(take)
        while (queue and free_slots and budget > 0 and
               (not args.kv_unified or
                reserved + len(prompts[queue[0]][0]) + prompts[queue[0]][1] <= kv_tokens)):
            r = queue.popleft()
            reserved += len(prompts[r][0]) + prompts[r][1]
            slot = free_slots.pop()
            ids = prompts[r][0]
            prompt_tokens += len(ids)
            take, rest = ids[:budget], ids[budget:]
            for i, tok in enumerate(take):
                add(tok, i, slot, not rest and i == len(take) - 1)
            active[slot] = [r, len(take), rest, 0, -1]
            budget -= len(take)
        batch.n_tokens = n
        rc = llama_cpp.llama_decode(ctx, batch)
        if rc != 0:
            print(f"llama_decode returned {rc}", file=sys.stderr)
            return 1
        for row, slot in rows:
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, row),
                                           shape=(n_vocab,))
            tok = int(np.argmax(logits))
            s = active[slot]
            s[3] += 1
            generated += 1
            s[4] = tok
            if llama_cpp.llama_vocab_is_eog(vocab, tok) or s[3] >= prompts[s[0]][1]:
                llama_cpp.llama_memory_seq_rm(memory, slot, -1, -1)
                reserved -= len(prompts[s[0]][0]) + prompts[s[0]][1]
                del active[slot]
                free_slots.append(slot)
    seconds = time.time() - t0
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    print(json.dumps({
        "requests": len(prompts), "prompt_tokens": prompt_tokens, "generated_tokens": generated,
        "seconds": seconds, "generated_tokens_per_s": generated / seconds,
        "total_tokens_per_s": (prompt_tokens + generated) / seconds,
        "parallel": args.parallel, "kv_tokens": kv_tokens, "kv_unified": args.kv_unified, "threads": args.threads,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "llama_cpp_python": llama_cpp.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
