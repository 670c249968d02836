"""moebatch: Python client and CLI for moebatchd, the moebatch batch-inference daemon.

The API is moebatch.v1.BatchService (proto/moebatch/v1/batch.proto in the repository); its
messages are in moebatch.v1.batch_pb2 (generated when the package is built).
"""
from .batch_requests import (
    build_request,
    build_requests,
    chat_request,
    completion_request,
    request_line,
    sampling_params,
    to_jsonl,
)
from .client import DEFAULT_SERVER, Client, default_server
from .errors import ClientError
from .jobs import (
    STATE_NAMES,
    TERMINAL_STATES,
    job_to_dict,
    parse_state,
    progress_to_dict,
    state_name,
)
from .v1 import batch_pb2 as pb

__version__ = "0.1.0"

__all__ = [
    "Client",
    "ClientError",
    "DEFAULT_SERVER",
    "STATE_NAMES",
    "TERMINAL_STATES",
    "build_request",
    "build_requests",
    "chat_request",
    "completion_request",
    "default_server",
    "job_to_dict",
    "parse_state",
    "pb",
    "progress_to_dict",
    "request_line",
    "sampling_params",
    "state_name",
    "to_jsonl",
]
