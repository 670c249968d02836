"""Job states by name, and plain-dict views of Job / JobProgress messages for printing."""
from __future__ import annotations

from typing import Any

from .v1 import batch_pb2 as pb

_PREFIX = "JOB_STATE_"

#: States after which a job never changes again.
TERMINAL_STATES = frozenset(
    {pb.JOB_STATE_COMPLETED, pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELLED, pb.JOB_STATE_EXPIRED}
)

#: The OpenAI Batch API names of the states, as the CLI prints and accepts them.
STATE_NAMES = tuple(
    name[len(_PREFIX):].lower()
    for name in pb.JobState.keys()
    if name != "JOB_STATE_UNSPECIFIED"
)


def state_name(state: int) -> str:
    """JOB_STATE_IN_PROGRESS -> "in_progress" (an unknown number -> "state_<n>")."""
    try:
        return pb.JobState.Name(state)[len(_PREFIX):].lower()
    except ValueError:
        return f"state_{int(state)}"


def parse_state(state: int | str) -> int:
    """A JobState from its number or name: "completed", "IN_PROGRESS", "in-progress" or
    "JOB_STATE_CANCELLED". Raises ValueError naming the valid names."""
    if isinstance(state, int) and not isinstance(state, bool):
        if state not in pb.JobState.values():
            raise ValueError(f"state: unknown job state {state}")
        return state
    if isinstance(state, str):
        key = state.strip().upper().replace("-", "_")
        if not key.startswith(_PREFIX):
            key = _PREFIX + key
        if key in pb.JobState.keys() and key != "JOB_STATE_UNSPECIFIED":
            return pb.JobState.Value(key)
    raise ValueError(f"state: must be one of {', '.join(STATE_NAMES)}, got {state!r}")


def _counts(counts: pb.RequestCounts) -> dict[str, int]:
    return {"total": counts.total, "completed": counts.completed, "failed": counts.failed}


def job_to_dict(job: pb.Job) -> dict[str, Any]:
    """A JSON-ready view of a Job, states by their OpenAI names."""
    return {
        "id": job.id,
        "state": state_name(job.state),
        "model": job.model,
        "metadata": dict(sorted(job.metadata.items())),
        "request_counts": _counts(job.request_counts),
        "created_at": job.created_at,
        "finished_at": job.finished_at,
        "error": job.error,
        "tenant": job.tenant,
        "started_at": job.started_at,
        "prompt_tokens": job.prompt_tokens,
        "generated_tokens": job.generated_tokens,
        "tokens_per_second": job.tokens_per_second,
        "elapsed_seconds": job.elapsed_seconds,
    }


def progress_to_dict(progress: pb.JobProgress) -> dict[str, Any]:
    """A JSON-ready view of a JobProgress."""
    return {
        "job_id": progress.job_id,
        "state": state_name(progress.state),
        "request_counts": _counts(progress.request_counts),
        "prompt_tokens": progress.prompt_tokens,
        "generated_tokens": progress.generated_tokens,
        "max_tokens_total": progress.max_tokens_total,
        "tokens_per_second": progress.tokens_per_second,
        "elapsed_seconds": progress.elapsed_seconds,
        "eta_seconds": progress.eta_seconds,
    }
