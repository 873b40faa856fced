package client

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cyclone-workflows/cyclone/sdks/go/cyclonepb"
	"github.com/cyclone-workflows/cyclone/sdks/go/internal/jsonv"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// fake is a Runs and Workflows server that records each request and its metadata and
// answers with the test's functions.
type fake struct {
	cyclonepb.UnimplementedRunsServer
	cyclonepb.UnimplementedWorkflowsServer

	mu    sync.Mutex
	calls []string
	reqs  []proto.Message
	mds   []metadata.MD

	submit   func(*cyclonepb.SubmitRunRequest) (*cyclonepb.SubmitRunResponse, error)
	getRun   func(*cyclonepb.GetRunRequest) (*cyclonepb.Run, error)
	waitRun  func(*cyclonepb.WaitRunRequest) (*cyclonepb.WaitRunResponse, error)
	register func(*cyclonepb.RegisterWorkflowRequest) (*cyclonepb.RegisterWorkflowResponse, error)
}

func (f *fake) record(ctx context.Context, method string, req proto.Message) {
	md, _ := metadata.FromIncomingContext(ctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, method)
	f.reqs = append(f.reqs, req)
	f.mds = append(f.mds, md)
}

func (f *fake) last() (string, proto.Message, metadata.MD) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(f.calls) - 1
	return f.calls[n], f.reqs[n], f.mds[n]
}

func (f *fake) count(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if c == method {
			n++
		}
	}
	return n
}

func (f *fake) SubmitRun(ctx context.Context, r *cyclonepb.SubmitRunRequest) (*cyclonepb.SubmitRunResponse, error) {
	f.record(ctx, "SubmitRun", r)
	if f.submit != nil {
		return f.submit(r)
	}
	return &cyclonepb.SubmitRunResponse{RunId: "run-1", Created: true}, nil
}

func (f *fake) Enqueue(ctx context.Context, r *cyclonepb.EnqueueRequest) (*cyclonepb.EnqueueResponse, error) {
	f.record(ctx, "Enqueue", r)
	return &cyclonepb.EnqueueResponse{RunId: "job-run", StepId: "job-step", Created: true}, nil
}

func (f *fake) EnqueueMany(ctx context.Context, r *cyclonepb.EnqueueManyRequest) (*cyclonepb.EnqueueManyResponse, error) {
	f.record(ctx, "EnqueueMany", r)
	resp := &cyclonepb.EnqueueManyResponse{}
	for i := range r.Jobs {
		resp.Jobs = append(resp.Jobs, &cyclonepb.EnqueueResponse{RunId: "many-" + string(rune('a'+i))})
	}
	return resp, nil
}

func (f *fake) GetRun(ctx context.Context, r *cyclonepb.GetRunRequest) (*cyclonepb.Run, error) {
	f.record(ctx, "GetRun", r)
	if f.getRun != nil {
		return f.getRun(r)
	}
	return &cyclonepb.Run{Id: r.RunId, State: cyclonepb.RunState_RUN_STATE_RUNNING}, nil
}

func (f *fake) WaitRun(ctx context.Context, r *cyclonepb.WaitRunRequest) (*cyclonepb.WaitRunResponse, error) {
	f.record(ctx, "WaitRun", r)
	return f.waitRun(r)
}

func action(ctx context.Context, f *fake, method string, req proto.Message, runID string) (*cyclonepb.RunActionResponse, error) {
	f.record(ctx, method, req)
	return &cyclonepb.RunActionResponse{Run: &cyclonepb.Run{Id: runID, State: cyclonepb.RunState_RUN_STATE_PAUSED}, Applied: true}, nil
}

func (f *fake) CancelRun(ctx context.Context, r *cyclonepb.CancelRunRequest) (*cyclonepb.RunActionResponse, error) {
	return action(ctx, f, "CancelRun", r, r.RunId)
}
func (f *fake) PauseRun(ctx context.Context, r *cyclonepb.PauseRunRequest) (*cyclonepb.RunActionResponse, error) {
	return action(ctx, f, "PauseRun", r, r.RunId)
}
func (f *fake) ResumeRun(ctx context.Context, r *cyclonepb.ResumeRunRequest) (*cyclonepb.RunActionResponse, error) {
	return action(ctx, f, "ResumeRun", r, r.RunId)
}
func (f *fake) RetryStep(ctx context.Context, r *cyclonepb.RetryStepRequest) (*cyclonepb.RunActionResponse, error) {
	return action(ctx, f, "RetryStep", r, r.RunId)
}
func (f *fake) RetryAll(ctx context.Context, r *cyclonepb.RetryAllRequest) (*cyclonepb.RunActionResponse, error) {
	return action(ctx, f, "RetryAll", r, r.RunId)
}
func (f *fake) Signal(ctx context.Context, r *cyclonepb.SignalRequest) (*cyclonepb.SignalResponse, error) {
	f.record(ctx, "Signal", r)
	return &cyclonepb.SignalResponse{SignalId: "sig-1"}, nil
}

func (f *fake) RegisterWorkflow(ctx context.Context, r *cyclonepb.RegisterWorkflowRequest) (*cyclonepb.RegisterWorkflowResponse, error) {
	f.record(ctx, "RegisterWorkflow", r)
	if f.register != nil {
		return f.register(r)
	}
	return &cyclonepb.RegisterWorkflowResponse{Workflow: &cyclonepb.Workflow{Name: r.Name, Version: 2, Nodes: r.Nodes},
		Created: true}, nil
}

func start(t *testing.T, opts Options) (*fake, *Client) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fake{}
	s := grpc.NewServer()
	cyclonepb.RegisterRunsServer(s, f)
	cyclonepb.RegisterWorkflowsServer(s, f)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	opts.Address = lis.Addr().String()
	c, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return f, c
}

func TestAWrongAddressFailsAtOnce(t *testing.T) {
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := lis.Addr().String()
	lis.Close() // nothing listens there now
	c, err := New(Options{Address: addr, RPCTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The call's own deadline is an hour: it fails because the client does not wait for a
	// server it never reached, not because time ran out.
	_, err = c.Get(context.Background(), "run")
	var e *Error
	if !errors.As(err, &e) || e.Code != codes.Unavailable || e.Message != "cannot reach "+addr+": connection refused" {
		t.Fatalf("got %v", err)
	}
	if !errors.Is(err, ErrUnavailable) || status.Code(err) != codes.Unavailable {
		t.Fatal("the error matches ErrUnavailable and its status code")
	}
	// WaitForServer waits that long first, then says so.
	c2, _ := New(Options{Address: addr, WaitForServer: 200 * time.Millisecond})
	defer c2.Close()
	if _, err := c2.Get(context.Background(), "run"); err == nil || !strings.Contains(err.Error(), "no server answered within 200ms") {
		t.Fatalf("WaitForServer: %v", err)
	}
}

func TestRegisterSendsTheBuiltWorkflow(t *testing.T) {
	f, c := start(t, Options{})
	wf := NewWorkflow("order").
		Task("reserve").
		Task("charge", Deps("reserve"), Kind("payments.charge"), MaxAttempts(5), BackoffInitial(2*time.Second),
			BackoffMax(time.Minute), MaxReclaims(0), AttemptTimeout(30*time.Second), Priority(-1)).
		Signal("approval", Deps("reserve"), SignalName("approve"), MaxWait(time.Hour)).
		Sleep("cool-off", 90*time.Second, Deps("approval")).
		Child("ship", "shipping", Deps("charge", "cool-off"), OnDepFailure(CancelBranch), Retention(24*time.Hour))
	info, err := c.Register(context.Background(), wf)
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != "order" || info.Version != 2 || !info.Created {
		t.Fatalf("info %+v", info)
	}
	_, req, _ := f.last()
	nodes := req.(*cyclonepb.RegisterWorkflowRequest).Nodes
	if len(nodes) != 5 {
		t.Fatalf("nodes %v", nodes)
	}
	charge := nodes[1]
	if charge.Kind != "payments.charge" || charge.GetMaxAttempts() != 5 || charge.MaxReclaims == nil || *charge.MaxReclaims != 0 ||
		charge.BackoffInitial.AsDuration() != 2*time.Second || charge.BackoffMax.AsDuration() != time.Minute ||
		charge.AttemptTimeout.AsDuration() != 30*time.Second || charge.GetPriority() != -1 || charge.Deps[0] != "reserve" {
		t.Fatalf("charge %v", charge)
	}
	if nodes[0].MaxAttempts != nil || nodes[0].MaxReclaims != nil || nodes[0].BackoffInitial != nil {
		t.Fatalf("unset options stay unset (the server's defaults): %v", nodes[0])
	}
	if a := nodes[2]; a.Type != cyclonepb.NodeType_NODE_TYPE_SIGNAL || a.Signal != "approve" || a.MaxWait.AsDuration() != time.Hour {
		t.Fatalf("approval %v", a)
	}
	if s := nodes[3]; s.Type != cyclonepb.NodeType_NODE_TYPE_SLEEP || s.Sleep.AsDuration() != 90*time.Second {
		t.Fatalf("sleep %v", s)
	}
	if ch := nodes[4]; ch.Type != cyclonepb.NodeType_NODE_TYPE_CHILD || ch.Workflow != "shipping" ||
		ch.OnDepFailure != cyclonepb.OnDepFailure_ON_DEP_FAILURE_CANCEL_BRANCH || ch.Retention.AsDuration() != 24*time.Hour {
		t.Fatalf("child %v", ch)
	}
	if got := wf.Kinds(); len(got) != 2 || got[0] != "reserve" || got[1] != "payments.charge" {
		t.Fatalf("kinds %v", got)
	}
}

func TestWorkflowMistakesAreReportedBeforeAnyCall(t *testing.T) {
	f, c := start(t, Options{})
	for _, tc := range []struct {
		wf   *Workflow
		want string
	}{
		{NewWorkflow("w").Task("a").Task("a"), `node "a": duplicate node id in workflow "w"`},
		{NewWorkflow("w").Task("a", MaxWait(time.Second)), `node "a": option MaxWait does not apply here`},
		{NewWorkflow("w").Signal("s", MaxAttempts(3)), `node "s": option MaxAttempts does not apply here`},
		{NewWorkflow("w").Task("a", BackoffInitial(-time.Second)), `node "a": BackoffInitial: -1s is not a non-negative duration`},
		{NewWorkflow("w").Task(""), "node id: must be a non-empty string"},
	} {
		_, err := c.Register(context.Background(), tc.wf)
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want %q", err, tc.want)
		}
	}
	if f.count("RegisterWorkflow") != 0 {
		t.Fatal("a bad definition was sent")
	}
}

func TestSubmitSendsInputOptionsTokenAndTrace(t *testing.T) {
	f, c := start(t, Options{Token: "tok"})
	ctx := WithTrace(context.Background(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "v=1")
	id, err := c.Submit(ctx, "etl", map[string]any{"day": "2026-12-01", "n": 3, "tag": "<a&b>"},
		IdempotencyKey("etl-1"), DeadlineIn(time.Hour), Version(2), Priority(5))
	if err != nil || id != "run-1" {
		t.Fatalf("Submit = %q, %v", id, err)
	}
	_, msg, md := f.last()
	req := msg.(*cyclonepb.SubmitRunRequest)
	if req.Workflow != "etl" || req.IdempotencyKey != "etl-1" || req.DeadlineIn.AsDuration() != time.Hour ||
		req.Version != 2 || req.Priority != 5 || req.Deadline != nil {
		t.Fatalf("request %v", req)
	}
	if got := string(jsonv.Compact(req.Input)); got != `{"day":"2026-12-01","n":3,"tag":"<a&b>"}` {
		t.Fatalf("input %s", got)
	}
	if md.Get("authorization")[0] != "Bearer tok" || md.Get("traceparent")[0] != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" ||
		md.Get("tracestate")[0] != "v=1" {
		t.Fatalf("metadata %v", md)
	}
	// No trace context: no traceparent.
	if _, err := c.Submit(context.Background(), "etl", nil); err != nil {
		t.Fatal(err)
	}
	if _, msg, md := f.last(); len(md.Get("traceparent")) != 0 || string(jsonv.Compact(msg.(*cyclonepb.SubmitRunRequest).Input)) != "null" {
		t.Fatalf("metadata %v", md)
	}
	if _, err := c.Submit(context.Background(), "etl", nil, MaxWait(time.Second)); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("an option Submit does not take: %v", err)
	}
	if _, err := c.Submit(context.Background(), "etl", map[string]any{"n": int64(1)<<53 + 1}); err == nil ||
		!strings.Contains(err.Error(), "input.n: integer 9007199254740993 is too large") {
		t.Fatalf("a number JSON cannot carry: %v", err)
	}
}

func TestEnqueueAndEnqueueMany(t *testing.T) {
	f, c := start(t, Options{})
	before := time.Now()
	id, err := c.Enqueue(context.Background(), "resize", map[string]any{"image": "cat.png"}, MaxAttempts(3),
		MaxReclaims(0), ScheduledIn(time.Minute), Retention(time.Hour), IdempotencyKey("k"))
	if err != nil || id != "job-run" {
		t.Fatalf("Enqueue = %q, %v", id, err)
	}
	_, msg, _ := f.last()
	req := msg.(*cyclonepb.EnqueueRequest)
	at := req.ScheduledAt.AsTime()
	if req.Kind != "resize" || req.GetMaxAttempts() != 3 || req.MaxReclaims == nil || req.GetMaxReclaims() != 0 ||
		req.Retention.AsDuration() != time.Hour || req.IdempotencyKey != "k" || at.Before(before.Add(time.Minute)) {
		t.Fatalf("request %v", req)
	}
	ids, err := c.EnqueueMany(context.Background(), []Job{{Kind: "a"}, {Kind: "b", Input: 1, Options: []Option{Priority(2)}}})
	if err != nil || len(ids) != 2 || ids[0] != "many-a" || ids[1] != "many-b" {
		t.Fatalf("EnqueueMany = %v, %v", ids, err)
	}
	_, err = c.EnqueueMany(context.Background(), []Job{{Kind: "a"}, {Kind: "b", Options: []Option{Deps("x")}}})
	if err == nil || !strings.Contains(err.Error(), "jobs[1]: option Deps does not apply here") {
		t.Fatalf("a bad job is named by its index: %v", err)
	}
	_, err = c.EnqueueMany(context.Background(), []Job{{Kind: "a"}, {Kind: "b", Input: map[string]any{"x": []any{int64(1)<<53 + 1}}}})
	if err == nil || !strings.Contains(err.Error(), "jobs[1].input.x[0]: integer") {
		t.Fatalf("a bad input is named by its path: %v", err)
	}
}

func TestStatusCodesBecomeTypedErrors(t *testing.T) {
	f, c := start(t, Options{})
	f.getRun = func(r *cyclonepb.GetRunRequest) (*cyclonepb.Run, error) {
		return nil, status.Error(codes.NotFound, "run nope: not found")
	}
	_, err := c.Get(context.Background(), "nope")
	var e *Error
	if !errors.As(err, &e) || e.Code != codes.NotFound || e.Message != "run nope: not found" ||
		err.Error() != "NOT_FOUND: run nope: not found" || !errors.Is(err, ErrNotFound) || errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("got %v", err)
	}
	f.submit = func(*cyclonepb.SubmitRunRequest) (*cyclonepb.SubmitRunResponse, error) {
		return nil, status.Error(codes.FailedPrecondition, "run is completed")
	}
	if _, err := c.Submit(context.Background(), "x", nil); !errors.Is(err, ErrFailedPrecondition) {
		t.Fatalf("got %v", err)
	}
	// A cancelled context: the error matches context.Canceled too.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Get(ctx, "x"); !errors.Is(err, context.Canceled) || !errors.Is(err, ErrCanceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

func TestReadsAreMadeAgainOnUnavailableWritesAreNot(t *testing.T) {
	f, c := start(t, Options{})
	if _, err := c.Get(context.Background(), "warm-up"); err != nil { // the server is reached
		t.Fatal(err)
	}
	fails := 2
	f.getRun = func(r *cyclonepb.GetRunRequest) (*cyclonepb.Run, error) {
		if fails > 0 {
			fails--
			return nil, status.Error(codes.Unavailable, "connection reset")
		}
		return &cyclonepb.Run{Id: r.RunId, State: cyclonepb.RunState_RUN_STATE_COMPLETED}, nil
	}
	run, err := c.Get(context.Background(), "r")
	if err != nil || run.State != "completed" || f.count("GetRun") != 4 {
		t.Fatalf("Get = %v, %v after %d calls", run, err, f.count("GetRun"))
	}
	f.submit = func(*cyclonepb.SubmitRunRequest) (*cyclonepb.SubmitRunResponse, error) {
		return nil, status.Error(codes.Unavailable, "connection reset")
	}
	if _, err := c.Submit(context.Background(), "x", nil); !errors.Is(err, ErrUnavailable) || f.count("SubmitRun") != 1 {
		t.Fatalf("a submit that may have been applied is not made again: %v (%d calls)", err, f.count("SubmitRun"))
	}
}

func runIn(state cyclonepb.RunState) *cyclonepb.Run {
	result, _ := structpb.NewValue(map[string]any{"load": map[string]any{"rows": 12.0}})
	r := &cyclonepb.Run{Id: "r", State: state, Steps: []*cyclonepb.Step{{Node: "load", State: cyclonepb.StepState_STEP_STATE_COMPLETED,
		Type: cyclonepb.NodeType_NODE_TYPE_TASK, Output: result.GetStructValue().Fields["load"]}}}
	switch state {
	case cyclonepb.RunState_RUN_STATE_COMPLETED:
		r.Result = result
	case cyclonepb.RunState_RUN_STATE_FAILED:
		r.Steps[0].State = cyclonepb.StepState_STEP_STATE_DISCARDED
		r.Steps[0].ErrorKind = "permanent"
		r.Steps[0].Errors = []*cyclonepb.StepError{{Attempt: 1, ErrorKind: "permanent", Message: "bad row"}}
	}
	return r
}

func TestWaitLoopsUntilTheRunIsTerminalAndResultReadsIt(t *testing.T) {
	f, c := start(t, Options{})
	polls := 0
	f.waitRun = func(r *cyclonepb.WaitRunRequest) (*cyclonepb.WaitRunResponse, error) {
		polls++
		if polls < 3 {
			return &cyclonepb.WaitRunResponse{Run: runIn(cyclonepb.RunState_RUN_STATE_RUNNING), TimedOut: true}, nil
		}
		return &cyclonepb.WaitRunResponse{Run: runIn(cyclonepb.RunState_RUN_STATE_COMPLETED)}, nil
	}
	result, err := c.Result(context.Background(), "r")
	if err != nil || polls != 3 {
		t.Fatalf("Result = %v, %v after %d polls", result, err, polls)
	}
	if result["load"].(map[string]any)["rows"] != 12.0 {
		t.Fatalf("result %v", result)
	}
	run, _ := c.Wait(context.Background(), "r")
	var typed struct {
		Load struct{ Rows int } `json:"load"`
	}
	var out struct{ Rows int }
	if err := run.DecodeResult(&typed); err != nil || typed.Load.Rows != 12 || run.Step("load").DecodeOutput(&out) != nil || out.Rows != 12 {
		t.Fatalf("decoded %+v %+v", typed, out)
	}
	if _, msg, _ := f.last(); msg.(*cyclonepb.WaitRunRequest).Timeout.AsDuration() != waitSlice {
		t.Fatalf("without a deadline each WaitRun waits %v, got %v", waitSlice, msg)
	}

	f.waitRun = func(*cyclonepb.WaitRunRequest) (*cyclonepb.WaitRunResponse, error) {
		return &cyclonepb.WaitRunResponse{Run: runIn(cyclonepb.RunState_RUN_STATE_FAILED)}, nil
	}
	_, err = c.Result(context.Background(), "r")
	var failed *RunFailedError
	if !errors.As(err, &failed) || err.Error() != "run r failed (load: permanent bad row)" || failed.Run.Steps[0].Errors[0].Message != "bad row" {
		t.Fatalf("failed: %v", err)
	}
	f.waitRun = func(*cyclonepb.WaitRunRequest) (*cyclonepb.WaitRunResponse, error) {
		return &cyclonepb.WaitRunResponse{Run: runIn(cyclonepb.RunState_RUN_STATE_CANCELLED)}, nil
	}
	var cancelled *RunCancelledError
	if _, err = c.Result(context.Background(), "r"); !errors.As(err, &cancelled) {
		t.Fatalf("cancelled: %v", err)
	}
}

func TestWaitGivesUpWithItsContext(t *testing.T) {
	f, c := start(t, Options{})
	f.waitRun = func(r *cyclonepb.WaitRunRequest) (*cyclonepb.WaitRunResponse, error) {
		time.Sleep(r.Timeout.AsDuration()) // the server's long poll
		return &cyclonepb.WaitRunResponse{Run: runIn(cyclonepb.RunState_RUN_STATE_RUNNING), TimedOut: true}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	run, err := c.Wait(ctx, "r")
	if !errors.Is(err, context.DeadlineExceeded) || run == nil || run.State != "running" {
		t.Fatalf("Wait = %v, %v", run, err)
	}
	_, msg, _ := f.last()
	if d := msg.(*cyclonepb.WaitRunRequest).Timeout.AsDuration(); d >= 300*time.Millisecond {
		t.Fatalf("the long poll must end before the caller's deadline: %v", d)
	}
}

func TestRunActionsAndSignal(t *testing.T) {
	f, c := start(t, Options{})
	ctx := context.Background()
	check := func(method string, run *Run, err error) proto.Message {
		t.Helper()
		got, msg, _ := f.last()
		if err != nil || got != method || run.ID != "r" || run.State != "paused" {
			t.Fatalf("%s: %v %v %v", method, got, run, err)
		}
		return msg
	}
	run, err := c.Cancel(ctx, "r")
	check("CancelRun", run, err)
	run, err = c.Pause(ctx, "r")
	check("PauseRun", run, err)
	run, err = c.Resume(ctx, "r")
	check("ResumeRun", run, err)
	run, err = c.Retry(ctx, "r", "load", DeadlineIn(time.Hour))
	if m := check("RetryStep", run, err).(*cyclonepb.RetryStepRequest); m.Node != "load" || m.DeadlineIn.AsDuration() != time.Hour {
		t.Fatalf("retry %v", m)
	}
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	run, err = c.RetryAll(ctx, "r", Deadline(at))
	if m := check("RetryAll", run, err).(*cyclonepb.RetryAllRequest); !m.Deadline.AsTime().Equal(at) || m.DeadlineIn != nil {
		t.Fatalf("retry all %v", m)
	}
	if _, err := c.RetryAll(ctx, "r", Deadline(at), DeadlineIn(time.Hour)); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("both deadlines: %v", err)
	}
	id, err := c.Signal(ctx, "r", "approval", map[string]any{"by": "ada"})
	_, msg, _ := f.last()
	m := msg.(*cyclonepb.SignalRequest)
	if err != nil || id != "sig-1" || m.RunId != "r" || m.Name != "approval" || string(jsonv.Compact(m.Payload)) != `{"by":"ada"}` {
		t.Fatalf("signal %q %v %v", id, m, err)
	}
}

func TestLimitsAreSentOnTasksAndJobsAndMistakesNamed(t *testing.T) {
	f, c := start(t, Options{})
	tenant := LimitUse{Limit: "per-tenant", KeyPath: "input.tenant"}
	wf := NewWorkflow("sync").Task("pull", Limits(tenant, LimitUse{Limit: "api", Key: "eu"})).Task("push", Deps("pull"))
	if _, err := c.Register(context.Background(), wf); err != nil {
		t.Fatal(err)
	}
	_, req, _ := f.last()
	nodes := req.(*cyclonepb.RegisterWorkflowRequest).Nodes
	if l := nodes[0].Limits; len(l) != 2 || l[0].Limit != "per-tenant" || l[0].KeyPath != "input.tenant" || l[0].Key != "" ||
		l[1].Limit != "api" || l[1].Key != "eu" || len(nodes[1].Limits) != 0 {
		t.Fatalf("nodes %v", nodes)
	}
	if _, err := c.Enqueue(context.Background(), "email", map[string]any{"tenant": "acme"}, Limits(LimitUse{Limit: "smtp"})); err != nil {
		t.Fatal(err)
	}
	_, msg, _ := f.last()
	if l := msg.(*cyclonepb.EnqueueRequest).Limits; len(l) != 1 || l[0].Limit != "smtp" || l[0].Key != "" || l[0].KeyPath != "" {
		t.Fatalf("enqueue limits %v", l)
	}
	bad := NewWorkflow("bad").Task("a", Limits(LimitUse{Limit: "x", Key: "k", KeyPath: "tenant"}))
	if err := bad.Err(); err == nil || !strings.Contains(err.Error(), `node "a": Limits[0]: Key and KeyPath both given`) {
		t.Fatalf("both keys: %v", err)
	}
	_, err := c.EnqueueMany(context.Background(), []Job{{Kind: "a"}, {Kind: "b", Options: []Option{Limits(LimitUse{})}}})
	if err == nil || !strings.Contains(err.Error(), "jobs[1]: Limits[0]: the limit's name is empty") {
		t.Fatalf("an unnamed limit: %v", err)
	}
	if err := NewWorkflow("w").Sleep("s", time.Second, Limits(tenant)).Err(); err == nil ||
		!strings.Contains(err.Error(), "option Limits does not apply here") {
		t.Fatalf("limits on a sleep node: %v", err)
	}
}
