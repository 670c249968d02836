package moebatch

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Error is a failed call to the daemon: its gRPC status code and message. Error() reads
// "CODE: message", e.g. "NOT_FOUND: job job_x not found" or "INVALID_ARGUMENT: 1 of 2 lines is
// invalid: line 2 (custom_id \"b\"): body.max_tokens: must be >= 1, got 0", the same text as the
// Python client's ClientError.
type Error struct {
	// Code is the status code: NotFound for an unknown job id, InvalidArgument for a refused
	// job, Unavailable when no daemon answers, Unauthenticated without a valid token, ...
	Code codes.Code
	// Message is the daemon's message (the status details).
	Message string
}

// Error returns "CODE: message".
func (e *Error) Error() string {
	return CodeName(e.Code) + ": " + e.Message
}

// GRPCStatus returns the error as a gRPC status, so that status.FromError and status.Code work
// on it.
func (e *Error) GRPCStatus() *status.Status {
	return status.New(e.Code, e.Message)
}

// Is reports whether target is an *Error with the same code (and the same message, when the
// target's message is not empty): errors.Is(err, &moebatch.Error{Code: codes.NotFound}).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok {
		return false
	}
	return t.Code == e.Code && (t.Message == "" || t.Message == e.Message)
}

// codeNames are the canonical names of the gRPC status codes (codes.Code.String() spells them
// in CamelCase, "NotFound"; the daemon, grpcurl and the Python client write "NOT_FOUND").
var codeNames = map[codes.Code]string{
	codes.OK:                 "OK",
	codes.Canceled:           "CANCELLED",
	codes.Unknown:            "UNKNOWN",
	codes.InvalidArgument:    "INVALID_ARGUMENT",
	codes.DeadlineExceeded:   "DEADLINE_EXCEEDED",
	codes.NotFound:           "NOT_FOUND",
	codes.AlreadyExists:      "ALREADY_EXISTS",
	codes.PermissionDenied:   "PERMISSION_DENIED",
	codes.ResourceExhausted:  "RESOURCE_EXHAUSTED",
	codes.FailedPrecondition: "FAILED_PRECONDITION",
	codes.Aborted:            "ABORTED",
	codes.OutOfRange:         "OUT_OF_RANGE",
	codes.Unimplemented:      "UNIMPLEMENTED",
	codes.Internal:           "INTERNAL",
	codes.Unavailable:        "UNAVAILABLE",
	codes.DataLoss:           "DATA_LOSS",
	codes.Unauthenticated:    "UNAUTHENTICATED",
}

// CodeName is the canonical upper-case name of a gRPC status code ("NOT_FOUND"); an unknown
// number gives "CODE(n)".
func CodeName(c codes.Code) string {
	if name, ok := codeNames[c]; ok {
		return name
	}
	return fmt.Sprintf("CODE(%d)", uint32(c))
}

// ErrorCode is the status code of err: OK for nil, the code of an *Error (or of any error that
// carries a gRPC status) anywhere in err's chain, Canceled or DeadlineExceeded for the context
// errors, and Unknown otherwise.
func ErrorCode(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	if s, ok := status.FromError(err); ok {
		return s.Code()
	}
	switch {
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	}
	return codes.Unknown
}

// wrapError turns what a gRPC call returned into an *Error: the status code and message for a
// status error, the context's error as Canceled / DeadlineExceeded. nil stays nil.
func wrapError(err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	if s, ok := status.FromError(err); ok {
		message := s.Message()
		if message == "" {
			message = strings.ToLower(CodeName(s.Code()))
		}
		return &Error{Code: s.Code(), Message: message}
	}
	switch {
	case errors.Is(err, context.Canceled):
		return &Error{Code: codes.Canceled, Message: err.Error()}
	case errors.Is(err, context.DeadlineExceeded):
		return &Error{Code: codes.DeadlineExceeded, Message: err.Error()}
	}
	return &Error{Code: codes.Unknown, Message: err.Error()}
}
