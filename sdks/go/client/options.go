package client

import (
	"fmt"
	"strings"
	"time"

	"github.com/cyclone-workflows/cyclone/sdks/go/cyclonepb"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Option sets one optional field of a workflow node (Workflow.Task and the other node
// methods), a run (Client.Submit), a job (Client.Enqueue, Job) or a retry
// (Client.Retry, Client.RetryAll). Each use accepts the options that apply to it; any
// other is an error naming it:
//
//	wf.Task("charge", client.Deps("reserve"), client.MaxAttempts(5), client.BackoffInitial(2*time.Second))
//	c.Enqueue(ctx, "resize", in, client.MaxAttempts(3), client.ScheduledIn(time.Minute))
//	c.Submit(ctx, "etl", in, client.IdempotencyKey("etl-2026-12-01"), client.DeadlineIn(time.Hour))
type Option func(*settings)

// DepFailure is what a node does when one of its dependencies is discarded.
type DepFailure int

const (
	// FailRun: the discard fails the run (fail-fast); the default.
	FailRun DepFailure = iota + 1
	// CancelBranch: this node is cancelled and the run goes on, if every node downstream
	// of the discard says so.
	CancelBranch
)

type settings struct {
	given []string // option names, in the order given
	err   error

	kind, signal, idempotencyKey       string
	deps                               []string
	maxAttempts, maxReclaims, priority int32
	version                            int32
	backoffInitial, backoffMax         time.Duration
	attemptTimeout, retention, maxWait time.Duration
	deadlineIn, scheduledIn            time.Duration
	deadline, scheduledAt              time.Time
	onDepFailure                       DepFailure
	limits                             []*cyclonepb.LimitUse
}

func opt(name string, set func(*settings)) Option {
	return func(s *settings) {
		s.given = append(s.given, name)
		set(s)
	}
}

func duration(name string, d time.Duration, set func(*settings)) Option {
	return opt(name, func(s *settings) {
		if d < 0 && s.err == nil {
			s.err = fmt.Errorf("%s: %v is not a non-negative duration", name, d)
		}
		set(s)
	})
}

// Kind is a task node's handler name (default: the node id).
func Kind(kind string) Option { return opt("Kind", func(s *settings) { s.kind = kind }) }

// Deps are the ids of the nodes that must complete before this one starts.
func Deps(ids ...string) Option {
	return opt("Deps", func(s *settings) { s.deps = append(s.deps, ids...) })
}

// MaxAttempts is how many executions a task or job gets (at least 1; default 25).
func MaxAttempts(n int) Option {
	return opt("MaxAttempts", func(s *settings) { s.maxAttempts = int32(n) })
}

// BackoffInitial is the delay after the first failed attempt (default 1 s); it doubles
// per attempt up to BackoffMax.
func BackoffInitial(d time.Duration) Option {
	return duration("BackoffInitial", d, func(s *settings) { s.backoffInitial = d })
}

// BackoffMax caps the backoff (default 10 min).
func BackoffMax(d time.Duration) Option {
	return duration("BackoffMax", d, func(s *settings) { s.backoffMax = d })
}

// Priority is the claim priority (lower is claimed first). On a node it overrides the
// run's; on Submit it is the run's default; on a job, the job's.
func Priority(p int) Option { return opt("Priority", func(s *settings) { s.priority = int32(p) }) }

// MaxReclaims is how many lease expiries are reclaimed before the step is discarded
// (at least 0; default 5).
func MaxReclaims(n int) Option {
	return opt("MaxReclaims", func(s *settings) { s.maxReclaims = int32(n) })
}

// AttemptTimeout is how long one execution may run (default 10 min).
func AttemptTimeout(d time.Duration) Option {
	return duration("AttemptTimeout", d, func(s *settings) { s.attemptTimeout = d })
}

// OnDepFailure says what the node does when a dependency is discarded.
func OnDepFailure(f DepFailure) Option {
	return opt("OnDepFailure", func(s *settings) { s.onDepFailure = f })
}

// Retention makes the run eligible for purge this long after it finishes.
func Retention(d time.Duration) Option {
	return duration("Retention", d, func(s *settings) { s.retention = d })
}

// MaxWait is the longest a wait node (child, sleep, signal) may wait.
func MaxWait(d time.Duration) Option {
	return duration("MaxWait", d, func(s *settings) { s.maxWait = d })
}

// SignalName is the signal a signal node waits for (default: the node id).
func SignalName(name string) Option { return opt("SignalName", func(s *settings) { s.signal = name }) }

// Version is the workflow version Submit runs (default: the latest).
func Version(v int) Option { return opt("Version", func(s *settings) { s.version = int32(v) }) }

// IdempotencyKey makes Submit or Enqueue safe to repeat: the same request with the same
// key returns the existing run.
func IdempotencyKey(key string) Option {
	return opt("IdempotencyKey", func(s *settings) { s.idempotencyKey = key })
}

// Deadline is an absolute run deadline (Submit, Enqueue) or a new one (Retry, RetryAll).
func Deadline(t time.Time) Option { return opt("Deadline", func(s *settings) { s.deadline = t }) }

// DeadlineIn is a run deadline relative to now.
func DeadlineIn(d time.Duration) Option {
	return duration("DeadlineIn", d, func(s *settings) { s.deadlineIn = d })
}

// ScheduledAt makes a job claimable from t on.
func ScheduledAt(t time.Time) Option {
	return opt("ScheduledAt", func(s *settings) { s.scheduledAt = t })
}

// ScheduledIn makes a job claimable d from now.
func ScheduledIn(d time.Duration) Option {
	return duration("ScheduledIn", d, func(s *settings) { s.scheduledIn = d })
}

// LimitUse is the use of a named limit by a task node or a job (docs/flow-control.md):
// the limit's name, and its key, a constant Key (a global cap when both are empty) or
// KeyPath, a field path into the run input ("input.tenant" or "tenant"); at most one.
type LimitUse struct {
	Limit   string
	Key     string
	KeyPath string
}

// Limits are limits a task node's steps or a job consume, besides those that name its
// kind. The limits themselves are set with the Limits service
// (cyclonepb.NewLimitsClient(c.Conn()), or `cyclone limits set`):
//
//	wf.Task("pull", client.Limits(client.LimitUse{Limit: "per-tenant", KeyPath: "input.tenant"}))
//	c.Enqueue(ctx, "email", in, client.Limits(client.LimitUse{Limit: "smtp"}))
func Limits(uses ...LimitUse) Option {
	return opt("Limits", func(s *settings) {
		for i, u := range uses {
			switch {
			case u.Limit == "" && s.err == nil:
				s.err = fmt.Errorf("Limits[%d]: the limit's name is empty", i)
			case u.Key != "" && u.KeyPath != "" && s.err == nil:
				s.err = fmt.Errorf("Limits[%d]: Key and KeyPath both given; at most one", i)
			}
			s.limits = append(s.limits, &cyclonepb.LimitUse{Limit: u.Limit, Key: u.Key, KeyPath: u.KeyPath})
		}
	})
}

// collect applies opts for a use that accepts `allowed`; where is the use, for errors.
func collect(where string, opts []Option, allowed ...string) (*settings, error) {
	s := &settings{}
	for _, o := range opts {
		if o != nil {
			o(s)
		}
	}
	for _, name := range s.given {
		ok := false
		for _, a := range allowed {
			ok = ok || a == name
		}
		if !ok {
			return nil, fmt.Errorf("%s: option %s does not apply here (it takes %s)", where, name, strings.Join(allowed, ", "))
		}
	}
	if s.err != nil {
		return nil, fmt.Errorf("%s: %w", where, s.err)
	}
	if s.has("Deadline") && s.has("DeadlineIn") {
		return nil, fmt.Errorf("%s: give Deadline or DeadlineIn, not both", where)
	}
	if s.has("ScheduledAt") && s.has("ScheduledIn") {
		return nil, fmt.Errorf("%s: give ScheduledAt or ScheduledIn, not both", where)
	}
	return s, nil
}

func (s *settings) has(name string) bool {
	for _, g := range s.given {
		if g == name {
			return true
		}
	}
	return false
}

func (s *settings) deadlineFields() (*timestamppb.Timestamp, *durationpb.Duration) {
	var at *timestamppb.Timestamp
	var in *durationpb.Duration
	if s.has("Deadline") {
		at = timestamppb.New(s.deadline)
	}
	if s.has("DeadlineIn") {
		in = durationpb.New(s.deadlineIn)
	}
	return at, in
}

func (s *settings) dur(name string, d time.Duration) *durationpb.Duration {
	if !s.has(name) {
		return nil
	}
	return durationpb.New(d)
}

func (s *settings) int32p(name string, v int32) *int32 {
	if !s.has(name) {
		return nil
	}
	return proto.Int32(v)
}

func (s *settings) depFailure() cyclonepb.OnDepFailure {
	switch {
	case !s.has("OnDepFailure"):
		return cyclonepb.OnDepFailure_ON_DEP_FAILURE_UNSPECIFIED
	case s.onDepFailure == CancelBranch:
		return cyclonepb.OnDepFailure_ON_DEP_FAILURE_CANCEL_BRANCH
	}
	return cyclonepb.OnDepFailure_ON_DEP_FAILURE_FAIL_RUN
}

var jobOptions = []string{"Priority", "IdempotencyKey", "Deadline", "DeadlineIn", "ScheduledAt", "ScheduledIn",
	"MaxAttempts", "BackoffInitial", "BackoffMax", "MaxReclaims", "AttemptTimeout", "Retention", "Limits"}

// Job is one standalone job for Client.EnqueueMany: Enqueue's arguments.
type Job struct {
	Kind    string
	Input   any
	Options []Option
}

func (j Job) request(where string) (*cyclonepb.EnqueueRequest, error) {
	s, err := collect(where, j.Options, jobOptions...)
	if err != nil {
		return nil, err
	}
	input, err := toValue(j.Input, "input", where)
	if err != nil {
		return nil, err
	}
	req := &cyclonepb.EnqueueRequest{
		Kind: j.Kind, Input: input, Priority: s.priority, IdempotencyKey: s.idempotencyKey,
		MaxAttempts: s.int32p("MaxAttempts", s.maxAttempts), MaxReclaims: s.int32p("MaxReclaims", s.maxReclaims),
		BackoffInitial: s.dur("BackoffInitial", s.backoffInitial), BackoffMax: s.dur("BackoffMax", s.backoffMax),
		AttemptTimeout: s.dur("AttemptTimeout", s.attemptTimeout), Retention: s.dur("Retention", s.retention),
		Limits: s.limits,
	}
	req.Deadline, req.DeadlineIn = s.deadlineFields()
	switch {
	case s.has("ScheduledAt"):
		req.ScheduledAt = timestamppb.New(s.scheduledAt)
	case s.has("ScheduledIn"):
		req.ScheduledAt = timestamppb.New(time.Now().Add(s.scheduledIn))
	}
	return req, nil
}
