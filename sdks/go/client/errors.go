package client

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Error is a failed call to the Cyclone server: the gRPC status code and its message.
// Match a kind of failure with errors.Is and the sentinels below (only the code is
// compared), or read Code:
//
//	if errors.Is(err, client.ErrNotFound) { ... }
//	var e *client.Error
//	if errors.As(err, &e) && e.Code == codes.FailedPrecondition { ... }
//
// status.Code(err) works too (Error has GRPCStatus).
type Error struct {
	Code    codes.Code
	Message string
}

// The sentinels of errors.Is, one per status code the server answers with.
var (
	ErrInvalidArgument    = &Error{Code: codes.InvalidArgument}    // bad input; the message names the field
	ErrNotFound           = &Error{Code: codes.NotFound}           // no such run, workflow, version or node
	ErrAlreadyExists      = &Error{Code: codes.AlreadyExists}      // an idempotency key of a different request
	ErrFailedPrecondition = &Error{Code: codes.FailedPrecondition} // the run's state forbids the action
	ErrUnavailable        = &Error{Code: codes.Unavailable}        // the server cannot be reached (or went away)
	ErrDeadlineExceeded   = &Error{Code: codes.DeadlineExceeded}   // the call's time ran out
	ErrCanceled           = &Error{Code: codes.Canceled}           // the call's context was cancelled
	ErrUnauthenticated    = &Error{Code: codes.Unauthenticated}    // no valid bearer token
	ErrPermissionDenied   = &Error{Code: codes.PermissionDenied}   // the token's role may not call it
	ErrResourceExhausted  = &Error{Code: codes.ResourceExhausted}  // a message over a size limit
)

func (e *Error) Error() string {
	if e.Message == "" {
		return codeName(e.Code)
	}
	return codeName(e.Code) + ": " + e.Message
}

// Is reports whether target is an *Error with the same code and no message (a sentinel),
// or the context error matching a Canceled or DeadlineExceeded call.
func (e *Error) Is(target error) bool {
	switch target {
	case context.Canceled:
		return e.Code == codes.Canceled
	case context.DeadlineExceeded:
		return e.Code == codes.DeadlineExceeded
	}
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.Code == e.Code
}

// GRPCStatus makes status.Code and status.FromError work on an *Error.
func (e *Error) GRPCStatus() *status.Status { return status.New(e.Code, e.Message) }

// ErrorFromStatus converts an error returned by a gRPC call (say, of the generated stubs
// in cyclonepb) into an *Error; nil stays nil, and an *Error is returned as it is.
func ErrorFromStatus(err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, context.Canceled) {
		return &Error{Code: codes.Canceled, Message: err.Error()}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return &Error{Code: codes.DeadlineExceeded, Message: err.Error()}
	}
	s, _ := status.FromError(err)
	return &Error{Code: s.Code(), Message: s.Message()}
}

// codeName is the status code as gRPC's specification and the Python SDK spell it
// ("NOT_FOUND").
func codeName(c codes.Code) string {
	name := c.String() // "NotFound", "OK", or "Code(42)"
	if strings.HasPrefix(name, "Code(") || name == "OK" {
		return strings.ToUpper(name)
	}
	var b strings.Builder
	for i, r := range name {
		if i > 0 && 'A' <= r && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	if c == codes.Canceled {
		return "CANCELLED"
	}
	return strings.ToUpper(b.String())
}

// RunFailedError is Result's error for a run that failed; Run holds its steps (see the
// discarded ones and their Errors).
type RunFailedError struct{ Run *Run }

func (e *RunFailedError) Error() string {
	var parts []string
	for _, s := range e.Run.Steps {
		if s.State != "discarded" {
			continue
		}
		msg := ""
		if n := len(s.Errors); n > 0 {
			msg = " " + s.Errors[n-1].Message
		}
		parts = append(parts, strings.TrimSpace(fmt.Sprintf("%s: %s%s", s.Node, s.ErrorKind, msg)))
	}
	if len(parts) == 0 {
		return fmt.Sprintf("run %s failed", e.Run.ID)
	}
	return fmt.Sprintf("run %s failed (%s)", e.Run.ID, strings.Join(parts, "; "))
}

// RunCancelledError is Result's error for a run that was cancelled.
type RunCancelledError struct{ Run *Run }

func (e *RunCancelledError) Error() string { return fmt.Sprintf("run %s was cancelled", e.Run.ID) }
