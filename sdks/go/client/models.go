package client

import (
	"strings"
	"time"

	"github.com/cyclone-workflows/cyclone/sdks/go/cyclonepb"
	"github.com/cyclone-workflows/cyclone/sdks/go/internal/jsonv"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Run is a run with its steps. State is the lifecycle document's word: "running",
// "paused", "completed", "failed" or "cancelled". Payloads (Input, Result, a step's
// Output) are JSON as encoding/json decodes it into `any` (numbers are float64); use
// DecodeResult and friends to decode them into your own types.
type Run struct {
	ID              string
	Workflow        string // empty for a standalone job
	WorkflowVersion int
	State           string
	Input           any
	// Result is set when completed: the outputs of the leaf nodes, by node id.
	Result         map[string]any
	Priority       int
	IdempotencyKey string
	Deadline       time.Time // zero: none
	ParentRunID    string    // for a child run
	ParentStepID   string
	CreatedAt      time.Time
	UpdatedAt      time.Time
	FinishedAt     time.Time // zero while not terminal
	Steps          []Step
	ScheduleName   string // the schedule that started the run, if one did
	ScheduleFireAt time.Time

	proto *cyclonepb.Run
}

// Terminal reports whether the run is completed, failed or cancelled (a failed run may
// still be reopened by Retry or RetryAll).
func (r *Run) Terminal() bool {
	return r.State == "completed" || r.State == "failed" || r.State == "cancelled"
}

// Step returns the step of node, or nil.
func (r *Run) Step(node string) *Step {
	for i := range r.Steps {
		if r.Steps[i].Node == node {
			return &r.Steps[i]
		}
	}
	return nil
}

// DecodeResult decodes the run's result (the leaf outputs by node id) into v, as
// encoding/json would (integral numbers decode into integer fields).
func (r *Run) DecodeResult(v any) error { return jsonv.Decode(r.proto.GetResult(), v) }

// DecodeInput decodes the run's input into v.
func (r *Run) DecodeInput(v any) error { return jsonv.Decode(r.proto.GetInput(), v) }

// Proto is the run as the server sent it.
func (r *Run) Proto() *cyclonepb.Run { return r.proto }

// Step is one node of one run. State is "pending", "available", "running", "completed",
// "discarded", "cancelled", "waiting_signal", "waiting_timer", "waiting_child" or
// "paused"; Type is "task", "child", "sleep" or "signal".
type Step struct {
	ID              string
	RunID           string
	Node            string
	Kind            string
	Type            string
	State           string
	Attempt         int
	MaxAttempts     int
	Reclaims        int
	MaxReclaims     int
	Snoozes         int
	Priority        int
	LeaseGeneration int64
	LeaseOwner      string
	Output          any
	ErrorKind       string // set when discarded: "permanent", "max_attempts", "reclaim_limit", "timeout"
	Reason          string // beside error_kind "permanent" for the engine's discards
	CancelCause     string
	ChildRunID      string
	Deps            []string
	Errors          []StepError // oldest first
	ScheduledAt     time.Time
	LeaseExpiry     time.Time
	CreatedAt       time.Time
	StartedAt       time.Time
	FinishedAt      time.Time
	AttemptDeadline time.Time

	output *structpb.Value
}

// DecodeOutput decodes the step's output into v.
func (s *Step) DecodeOutput(v any) error { return jsonv.Decode(s.output, v) }

// StepError is one entry of a step's error history.
type StepError struct {
	Attempt   int
	ErrorKind string // "error" for a retried failure, "timeout", or the discard's error_kind
	Message   string
	At        time.Time
	Reason    string
	Details   string // the worker's Failed.details (a stack trace), cut at 16 KiB
}

// WorkflowInfo is one stored version of a workflow.
type WorkflowInfo struct {
	Name      string
	Version   int
	Nodes     []*cyclonepb.Node // with the server's defaults filled in
	CreatedAt time.Time
	Created   bool // Register: true when this call stored a new version
}

func enumWord(name, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(name, prefix))
}

func timeOf(t *timestamppb.Timestamp) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.AsTime()
}

func runFromProto(p *cyclonepb.Run) *Run {
	if p == nil {
		return nil
	}
	r := &Run{
		ID: p.Id, Workflow: p.Workflow, WorkflowVersion: int(p.WorkflowVersion),
		State: enumWord(p.State.String(), "RUN_STATE_"), Input: jsonv.Plain(p.Input),
		Priority: int(p.Priority), IdempotencyKey: p.IdempotencyKey, Deadline: timeOf(p.Deadline),
		ParentRunID: p.ParentRunId, ParentStepID: p.ParentStepId, CreatedAt: timeOf(p.CreatedAt),
		UpdatedAt: timeOf(p.UpdatedAt), FinishedAt: timeOf(p.FinishedAt), ScheduleName: p.ScheduleName,
		ScheduleFireAt: timeOf(p.ScheduleFireAt), proto: p,
	}
	if m, ok := jsonv.Plain(p.Result).(map[string]any); ok {
		r.Result = m
	}
	for _, s := range p.Steps {
		r.Steps = append(r.Steps, stepFromProto(s))
	}
	return r
}

func stepFromProto(s *cyclonepb.Step) Step {
	out := Step{
		ID: s.Id, RunID: s.RunId, Node: s.Node, Kind: s.Kind, Type: enumWord(s.Type.String(), "NODE_TYPE_"),
		State: enumWord(s.State.String(), "STEP_STATE_"), Attempt: int(s.Attempt), MaxAttempts: int(s.MaxAttempts),
		Reclaims: int(s.Reclaims), MaxReclaims: int(s.MaxReclaims), Snoozes: int(s.Snoozes), Priority: int(s.Priority),
		LeaseGeneration: s.LeaseGeneration, LeaseOwner: s.LeaseOwner, Output: jsonv.Plain(s.Output),
		ErrorKind: s.ErrorKind, Reason: s.Reason, CancelCause: s.CancelCause, ChildRunID: s.ChildRunId,
		Deps: append([]string(nil), s.Deps...), ScheduledAt: timeOf(s.ScheduledAt), LeaseExpiry: timeOf(s.LeaseExpiry),
		CreatedAt: timeOf(s.CreatedAt), StartedAt: timeOf(s.StartedAt), FinishedAt: timeOf(s.FinishedAt),
		AttemptDeadline: timeOf(s.AttemptDeadline), output: s.Output,
	}
	for _, e := range s.Errors {
		out.Errors = append(out.Errors, StepError{Attempt: int(e.Attempt), ErrorKind: e.ErrorKind, Message: e.Message,
			At: timeOf(e.At), Reason: e.Reason, Details: e.Details})
	}
	return out
}

func workflowFromProto(w *cyclonepb.Workflow, created bool) WorkflowInfo {
	return WorkflowInfo{Name: w.GetName(), Version: int(w.GetVersion()), Nodes: w.GetNodes(),
		CreatedAt: timeOf(w.GetCreatedAt()), Created: created}
}
