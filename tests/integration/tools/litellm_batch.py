"""Runs one batch through LiteLLM's Files and Batches functions (custom_llm_provider="openai",
api_base pointing at moebatchd): what LiteLLM users do to pass batches to an OpenAI-compatible
server. Prints {"status", "request_counts", "output": [lines]} as JSON on stdout.

Usage: litellm_batch.py BASE_URL API_KEY INPUT.jsonl
"""
import json
import sys
import time

import litellm


def main() -> int:
    base_url, api_key, path = sys.argv[1:4]
    common = {"custom_llm_provider": "openai", "api_base": base_url, "api_key": api_key}
    with open(path, "rb") as f:
        file = litellm.create_file(file=f, purpose="batch", **common)
    batch = litellm.create_batch(completion_window="24h", endpoint="/v1/chat/completions",
                                 input_file_id=file.id, metadata={"via": "litellm"}, **common)
    deadline = time.time() + 120
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        if time.time() > deadline:
            raise SystemExit(f"batch {batch.id} did not finish: {batch.status}")
        time.sleep(0.2)
        batch = litellm.retrieve_batch(batch_id=batch.id, **common)
    content = litellm.file_content(file_id=batch.output_file_id, **common)
    listed = litellm.list_batches(limit=10, **common)
    print(json.dumps({
        "status": batch.status,
        "request_counts": {"total": batch.request_counts.total,
                           "completed": batch.request_counts.completed,
                           "failed": batch.request_counts.failed},
        "listed": [b.id for b in listed.data],
        "id": batch.id,
        "output": content.content.decode().splitlines(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
