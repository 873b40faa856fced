package worker

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// The outcomes a handler returns besides success. Each wraps (or is) an error, so
// errors.Is / errors.As see through them, and Failed.details shows the chain.

type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// Permanent fails the step for good: it is discarded at once, not retried
// (Failed.permanent; error_kind "permanent").
//
//	if in.Amount <= 0 {
//		return nil, worker.Permanent(errors.New("amount must be positive"))
//	}
func Permanent(err error) error {
	if err == nil {
		err = errors.New("permanent failure")
	}
	return permanentError{err}
}

type retryError struct {
	err   error
	delay time.Duration
}

func (e retryError) Error() string { return e.err.Error() }
func (e retryError) Unwrap() error { return e.err }

// RetryAfter fails this attempt and asks for the next one after d, instead of the
// node's backoff (Failed.retry_delay). On the last attempt the step is discarded all the
// same.
//
//	if resp.StatusCode == http.StatusTooManyRequests {
//		return nil, worker.RetryAfter(errors.New("rate limited"), 30*time.Second)
//	}
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		err = fmt.Errorf("retry after %v", d)
	}
	return retryError{err, d}
}

type snoozeError struct{ delay time.Duration }

func (e snoozeError) Error() string { return fmt.Sprintf("snooze %v", e.delay) }

// Snooze runs the step again after d. It is not a failure: the attempt stays the same
// and the step's snoozes count grows (Lease.Snoozes tells the next run of it).
//
//	if !reportReady(in.ReportID) {
//		return nil, worker.Snooze(30 * time.Second)
//	}
func Snooze(d time.Duration) error { return snoozeError{d} }

// IsPermanent reports whether err (a handler's error) fails the step for good.
func IsPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p)
}

// SnoozeDelay reports whether err (a handler's error) is a Snooze, and its delay.
func SnoozeDelay(err error) (time.Duration, bool) {
	var s snoozeError
	if errors.As(err, &s) {
		return s.delay, true
	}
	return 0, false
}

// RetryDelay reports whether err (a handler's error) asks for its own retry delay, and it.
func RetryDelay(err error) (time.Duration, bool) {
	var r retryError
	if errors.As(err, &r) {
		return r.delay, true
	}
	return 0, false
}

// PanicError is the error of a handler that panicked: the panic's value and the stack
// of the goroutine that panicked. It is a retryable failure whose Failed.details is the
// stack.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("handler panicked: %v", e.Value) }

// StopError is the cause of a handler context's cancellation (context.Cause(ctx)): the
// server sent Stop for the lease (Reason "cancelled", "timeout", "fenced"), listed it as
// lost after a reconnect ("lost"), or the worker stopped without letting the handler
// finish ("shutdown"). The handler's result is not sent.
type StopError struct{ Reason string }

func (e *StopError) Error() string { return "cyclone: lease stopped: " + e.Reason }

// FencedError is CompleteInTx's error when the step's lease is no longer this handler's
// (cancelled, reclaimed, already ended): nothing was committed. Status is the engine's
// refusal: "stale", "ended" or "unknown".
type FencedError struct {
	Status          string
	StepID          string
	LeaseGeneration int64
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("step %s generation %d: result refused (%s)", e.StepID, e.LeaseGeneration, e.Status)
}

// details is Failed.details for a handler's error: Go errors carry no stack, so it is the
// chain of wrapped errors (type: message, outermost first), and for a panic the stack of
// the goroutine that panicked.
func details(err error) string {
	var p *PanicError
	if errors.As(err, &p) {
		return p.Error() + "\n\n" + string(p.Stack)
	}
	var b strings.Builder
	for e := err; e != nil; e = errors.Unwrap(e) {
		fmt.Fprintf(&b, "%T: %s\n", e, e.Error())
	}
	return b.String()
}
