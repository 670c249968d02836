package moebatch

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestCodeName(t *testing.T) {
	cases := map[codes.Code]string{
		codes.OK:              "OK",
		codes.Canceled:        "CANCELLED",
		codes.InvalidArgument: "INVALID_ARGUMENT",
		codes.NotFound:        "NOT_FOUND",
		codes.Unavailable:     "UNAVAILABLE",
		codes.Unauthenticated: "UNAUTHENTICATED",
		codes.Code(99):        "CODE(99)",
	}
	for code, want := range cases {
		if got := CodeName(code); got != want {
			t.Errorf("CodeName(%d) = %q, want %q", code, got, want)
		}
	}
}

func TestWrapErrorKeepsCodeAndMessage(t *testing.T) {
	err := wrapError(status.Error(codes.InvalidArgument, "line 2: body.max_tokens: must be >= 1, got 0"))
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("wrapError returned %T, want *Error", err)
	}
	if e.Code != codes.InvalidArgument || e.Message != "line 2: body.max_tokens: must be >= 1, got 0" {
		t.Errorf("got code %v message %q", e.Code, e.Message)
	}
	if got, want := err.Error(), "INVALID_ARGUMENT: line 2: body.max_tokens: must be >= 1, got 0"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	// The gRPC status survives, for code written against status.Code.
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("status.Code = %v, want InvalidArgument", status.Code(err))
	}
}

func TestWrapErrorOtherCases(t *testing.T) {
	if wrapError(nil) != nil {
		t.Error("wrapError(nil) != nil")
	}
	cases := []struct {
		in   error
		want string
	}{
		{status.Error(codes.Unavailable, ""), "UNAVAILABLE: unavailable"},
		{context.Canceled, "CANCELLED: context canceled"},
		{fmt.Errorf("call: %w", context.DeadlineExceeded), "DEADLINE_EXCEEDED: call: context deadline exceeded"},
		{errors.New("boom"), "UNKNOWN: boom"},
		{&Error{Code: codes.NotFound, Message: "job x not found"}, "NOT_FOUND: job x not found"},
	}
	for _, c := range cases {
		if got := wrapError(c.in).Error(); got != c.want {
			t.Errorf("wrapError(%v) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestErrorCodeAndIs(t *testing.T) {
	base := &Error{Code: codes.NotFound, Message: "job job_x not found"}
	wrapped := fmt.Errorf("status: %w", base)
	if got := ErrorCode(wrapped); got != codes.NotFound {
		t.Errorf("ErrorCode(wrapped) = %v", got)
	}
	if !errors.Is(wrapped, &Error{Code: codes.NotFound}) {
		t.Error("errors.Is by code failed")
	}
	if errors.Is(wrapped, &Error{Code: codes.NotFound, Message: "other"}) {
		t.Error("errors.Is matched another message")
	}
	if errors.Is(wrapped, &Error{Code: codes.InvalidArgument}) {
		t.Error("errors.Is matched another code")
	}
	if ErrorCode(nil) != codes.OK || ErrorCode(errors.New("x")) != codes.Unknown {
		t.Error("ErrorCode of nil / a plain error")
	}
	if ErrorCode(status.Error(codes.Aborted, "a")) != codes.Aborted {
		t.Error("ErrorCode of a raw status error")
	}
	if ErrorCode(context.Canceled) != codes.Canceled {
		t.Error("ErrorCode(context.Canceled)")
	}
}
