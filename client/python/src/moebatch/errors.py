"""ClientError: a failed call to moebatchd, carrying its gRPC status code and message."""
from __future__ import annotations

import grpc


class ClientError(Exception):
    """A gRPC call to the daemon failed.

    `code` is the grpc.StatusCode (NOT_FOUND for an unknown job id, INVALID_ARGUMENT for a refused
    job, UNAVAILABLE when no daemon answers, ...), `message` the daemon's message (the status
    details). str(error) is "CODE: message", e.g. "NOT_FOUND: job job_x not found".
    """

    def __init__(self, code: grpc.StatusCode, message: str):
        self.code = code
        self.message = message
        super().__init__(f"{code.name}: {message}")

    @property
    def code_name(self) -> str:
        return self.code.name

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> "ClientError":
        code = error.code() if hasattr(error, "code") else None
        details = error.details() if hasattr(error, "details") else None
        if not isinstance(code, grpc.StatusCode):
            code = grpc.StatusCode.UNKNOWN
        return cls(code, details or str(error) or code.name.lower())
