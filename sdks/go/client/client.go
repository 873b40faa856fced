// Package client is Cyclone's Go client: register workflows, start runs and standalone
// jobs, read, wait for and steer them (cancel, pause, resume, retry, signal).
//
//	c, err := client.New(client.Options{Address: "127.0.0.1:7233"})
//	if err != nil { ... }
//	defer c.Close()
//	if _, err := c.Register(ctx, client.NewWorkflow("hello").Task("greet")); err != nil { ... }
//	runID, err := c.Submit(ctx, "hello", map[string]any{"name": "Ada"})
//	result, err := c.Result(ctx, runID) // {"greet": ...}, or *RunFailedError / *RunCancelledError
//
// Every call takes a context.Context: its deadline and cancellation bound the call (and
// Wait and Result), and a W3C trace context in it (a worker's handler context, or one
// given with WithTrace) goes along as `traceparent` metadata, so a run submitted from a
// handler joins the handler's trace. Failed calls return *Error, with the gRPC status
// code; see the Err* sentinels.
package client

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cyclone-workflows/cyclone/sdks/go/cyclonepb"
	"github.com/cyclone-workflows/cyclone/sdks/go/internal/dial"
	"github.com/cyclone-workflows/cyclone/sdks/go/internal/jsonv"
	"github.com/cyclone-workflows/cyclone/sdks/go/internal/w3c"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Options configure a Client. Address is required.
type Options struct {
	Address string                           // HOST:PORT of a Cyclone server
	Token   string                           // bearer token, for a server with auth
	TLS     credentials.TransportCredentials // nil: plaintext
	// RPCTimeout bounds each call (default 30 s), within the context's own deadline.
	RPCTimeout time.Duration
	// WaitForServer: until the server has answered once, a call fails at once when
	// nothing listens at Address (UNAVAILABLE, "cannot reach HOST:PORT: connection
	// refused"); with WaitForServer > 0 it first waits that long for a server that is
	// still starting.
	WaitForServer time.Duration
	// TraceHeaders returns the W3C trace context to send with a call made with ctx
	// (traceparent "" for none). Default: the one ctx carries (TraceFromContext). The
	// cycloneotel package has one that sends the current OpenTelemetry span's.
	TraceHeaders func(ctx context.Context) (traceparent, tracestate string)
	DialOptions  []grpc.DialOption // appended to the SDK's own
}

// TraceContext is a parsed W3C trace context (see WithTrace, TraceFromContext).
type TraceContext = w3c.TraceContext

// WithTrace returns ctx carrying the W3C trace context traceparent / tracestate (nil
// when malformed): calls made with it send them, so the runs they start join that trace.
func WithTrace(ctx context.Context, traceparent, tracestate string) context.Context {
	return w3c.NewContext(ctx, w3c.Parse(traceparent, tracestate))
}

// TraceFromContext returns the trace context ctx carries (a worker handler's context
// carries its lease's), or nil.
func TraceFromContext(ctx context.Context) *TraceContext { return w3c.FromContext(ctx) }

func defaultTraceHeaders(ctx context.Context) (string, string) {
	if t := w3c.FromContext(ctx); t != nil {
		return t.Traceparent, t.Tracestate
	}
	return "", ""
}

// Client is a client of one Cyclone server; safe for concurrent use. Close it when done.
type Client struct {
	opts      Options
	conn      *grpc.ClientConn
	runs      cyclonepb.RunsClient
	workflows cyclonepb.WorkflowsClient
	admin     cyclonepb.AdminClient
	reached   atomic.Bool // the server has answered once: calls then wait across restarts
}

// New makes a Client. It connects in the background: a wrong address shows at the
// first call, which then fails fast (see Options.WaitForServer).
func New(opts Options) (*Client, error) {
	if opts.RPCTimeout <= 0 {
		opts.RPCTimeout = 30 * time.Second
	}
	if opts.WaitForServer < 0 {
		return nil, fmt.Errorf("cyclone client: WaitForServer %v is negative", opts.WaitForServer)
	}
	if opts.TraceHeaders == nil {
		opts.TraceHeaders = defaultTraceHeaders
	}
	conn, err := dial.Dial(dial.Config{Address: opts.Address, Token: opts.Token, TLS: opts.TLS, Extra: opts.DialOptions})
	if err != nil {
		return nil, err
	}
	return &Client{opts: opts, conn: conn, runs: cyclonepb.NewRunsClient(conn),
		workflows: cyclonepb.NewWorkflowsClient(conn), admin: cyclonepb.NewAdminClient(conn)}, nil
}

// Close closes the connection; calls in progress end with CANCELLED.
func (c *Client) Close() error { return c.conn.Close() }

// Conn is the client's gRPC connection, for calls the Client does not wrap (the
// Schedules service, say: cyclonepb.NewSchedulesClient(c.Conn())).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// Calls that change nothing, or nothing more when made twice: made again when the
// connection they were sent on broke under them.
var repeatable = map[string]bool{"GetRun": true, "GetWorkflow": true, "ListRuns": true, "ListWorkflows": true,
	"WaitRun": true, "RegisterWorkflow": true, "GetStats": true, "ListWorkers": true}

// Statuses a call can end with that the server did not send: it may not have been reached.
var notAnAnswer = map[codes.Code]bool{codes.Unavailable: true, codes.DeadlineExceeded: true, codes.Canceled: true,
	codes.Unknown: true}

// call makes one RPC (do), with the client's deadline, trace metadata and retry rules.
func (c *Client) call(ctx context.Context, method string, timeout time.Duration,
	do func(ctx context.Context, opts ...grpc.CallOption) error) error {
	if !c.reached.Load() && c.opts.WaitForServer > 0 {
		if err := c.waitReady(ctx); err != nil {
			return err
		}
	}
	if timeout <= 0 {
		timeout = c.opts.RPCTimeout
	}
	deadline := time.Now().Add(timeout)
	if tp, ts := c.opts.TraceHeaders(ctx); tp != "" {
		pairs := []string{"traceparent", tp}
		if ts != "" {
			pairs = append(pairs, "tracestate", ts)
		}
		ctx = metadata.AppendToOutgoingContext(ctx, pairs...)
	}
	for {
		cctx, cancel := context.WithDeadline(ctx, deadline)
		// Once the server has answered, a call made while it restarts waits for it (up to
		// its deadline) instead of failing; before that, a wrong address fails at once.
		err := do(cctx, grpc.WaitForReady(c.reached.Load()))
		cancel()
		if err == nil {
			c.reached.Store(true)
			return nil
		}
		if ctx.Err() != nil {
			return &Error{Code: status.FromContextError(ctx.Err()).Code(), Message: ctx.Err().Error()}
		}
		code := status.Code(err)
		if !notAnAnswer[code] {
			c.reached.Store(true) // refused, but by the server: it is there
		}
		if !c.reached.Load() && code == codes.Unavailable {
			return &Error{Code: codes.Unavailable, Message: fmt.Sprintf("cannot reach %s: %s", c.opts.Address,
				unreachable(status.Convert(err).Message()))}
		}
		// A call sent on a connection that broke under it is made again when repeating
		// it is harmless; a write may have been applied, so its caller decides.
		if code == codes.Unavailable && repeatable[method] && time.Now().Before(deadline) {
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		return ErrorFromStatus(err)
	}
}

func (c *Client) waitReady(ctx context.Context) error {
	wctx, cancel := context.WithTimeout(ctx, c.opts.WaitForServer)
	defer cancel()
	for {
		state := c.conn.GetState()
		if state == connectivity.Ready {
			return nil
		}
		if !c.conn.WaitForStateChange(wctx, state) {
			if ctx.Err() != nil {
				return ErrorFromStatus(ctx.Err())
			}
			return &Error{Code: codes.Unavailable, Message: fmt.Sprintf("cannot reach %s: no server answered within %v",
				c.opts.Address, c.opts.WaitForServer)}
		}
	}
}

// unreachable is gRPC's connect failure in a few words.
func unreachable(details string) string {
	lowered := strings.ToLower(details)
	for _, p := range [][2]string{{"connection refused", "connection refused"}, {"no such host", "unknown host"},
		{"lookup", "unknown host"}, {"dns", "unknown host"}, {"timed out", "connection timed out"},
		{"no route", "no route to host"}} {
		if strings.Contains(lowered, p[0]) {
			return p[1]
		}
	}
	return details
}

func toValue(v any, field, where string) (*structpb.Value, error) {
	path := field
	if where != "" {
		path = where + "." + field
	}
	value, err := jsonv.ToValue(v, path)
	if err != nil {
		return nil, &Error{Code: codes.InvalidArgument, Message: err.Error()}
	}
	return value, nil
}

func invalid(err error) error { return &Error{Code: codes.InvalidArgument, Message: err.Error()} }

// -- workflows ----------------------------------------------------------------------------

// Register stores a workflow definition. Registering the same definition again is a
// no-op (Created false), so it is safe at every start.
func (c *Client) Register(ctx context.Context, wf *Workflow) (WorkflowInfo, error) {
	req, err := wf.Request()
	if err != nil {
		return WorkflowInfo{}, invalid(err)
	}
	var resp *cyclonepb.RegisterWorkflowResponse
	err = c.call(ctx, "RegisterWorkflow", 0, func(ctx context.Context, o ...grpc.CallOption) (err error) {
		resp, err = c.workflows.RegisterWorkflow(ctx, req, o...)
		return err
	})
	if err != nil {
		return WorkflowInfo{}, err
	}
	return workflowFromProto(resp.Workflow, resp.Created), nil
}

// GetWorkflow returns one version of a workflow (the latest for version 0).
func (c *Client) GetWorkflow(ctx context.Context, name string, version int) (WorkflowInfo, error) {
	var resp *cyclonepb.Workflow
	err := c.call(ctx, "GetWorkflow", 0, func(ctx context.Context, o ...grpc.CallOption) (err error) {
		resp, err = c.workflows.GetWorkflow(ctx, &cyclonepb.GetWorkflowRequest{Name: name, Version: int32(version)}, o...)
		return err
	})
	if err != nil {
		return WorkflowInfo{}, err
	}
	return workflowFromProto(resp, false), nil
}

// -- starting runs --------------------------------------------------------------------------

// Submit starts a run of a registered workflow with input (anything encoding/json
// marshals; nil is JSON null) and returns its run id. Options: Version, Priority,
// IdempotencyKey, Deadline, DeadlineIn.
func (c *Client) Submit(ctx context.Context, workflow string, input any, opts ...Option) (string, error) {
	s, err := collect("Submit", opts, "Version", "Priority", "IdempotencyKey", "Deadline", "DeadlineIn")
	if err != nil {
		return "", invalid(err)
	}
	value, err := toValue(input, "input", "")
	if err != nil {
		return "", err
	}
	req := &cyclonepb.SubmitRunRequest{Workflow: workflow, Version: s.version, Input: value, Priority: s.priority,
		IdempotencyKey: s.idempotencyKey}
	req.Deadline, req.DeadlineIn = s.deadlineFields()
	var resp *cyclonepb.SubmitRunResponse
	err = c.call(ctx, "SubmitRun", 0, func(ctx context.Context, o ...grpc.CallOption) (err error) {
		resp, err = c.runs.SubmitRun(ctx, req, o...)
		return err
	})
	if err != nil {
		return "", err
	}
	return resp.RunId, nil
}

// Enqueue starts a standalone job (a one-node run of step kind `kind`) and returns its
// run id. Options: Priority, IdempotencyKey, Deadline, DeadlineIn, ScheduledAt,
// ScheduledIn, MaxAttempts, BackoffInitial, BackoffMax, MaxReclaims, AttemptTimeout,
// Retention, Limits.
func (c *Client) Enqueue(ctx context.Context, kind string, input any, opts ...Option) (string, error) {
	req, err := Job{Kind: kind, Input: input, Options: opts}.request("Enqueue")
	if err != nil {
		return "", invalid(err)
	}
	var resp *cyclonepb.EnqueueResponse
	err = c.call(ctx, "Enqueue", 0, func(ctx context.Context, o ...grpc.CallOption) (err error) {
		resp, err = c.runs.Enqueue(ctx, req, o...)
		return err
	})
	if err != nil {
		return "", err
	}
	return resp.RunId, nil
}

// EnqueueMany starts up to 1000 standalone jobs in one call and one transaction (all
// or none) and returns their run ids in order. A bad job fails the whole call, with an
// error naming it by index ("jobs[3].kind: ...").
func (c *Client) EnqueueMany(ctx context.Context, jobs []Job) ([]string, error) {
	req := &cyclonepb.EnqueueManyRequest{}
	for i, job := range jobs {
		r, err := job.request(fmt.Sprintf("jobs[%d]", i))
		if err != nil {
			return nil, invalid(err)
		}
		req.Jobs = append(req.Jobs, r)
	}
	var resp *cyclonepb.EnqueueManyResponse
	err := c.call(ctx, "EnqueueMany", 0, func(ctx context.Context, o ...grpc.CallOption) (err error) {
		resp, err = c.runs.EnqueueMany(ctx, req, o...)
		return err
	})
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(resp.Jobs))
	for i, j := range resp.Jobs {
		ids[i] = j.RunId
	}
	return ids, nil
}

// -- reading --------------------------------------------------------------------------------

// Get returns a run with all its steps.
func (c *Client) Get(ctx context.Context, runID string) (*Run, error) {
	var resp *cyclonepb.Run
	err := c.call(ctx, "GetRun", 0, func(ctx context.Context, o ...grpc.CallOption) (err error) {
		resp, err = c.runs.GetRun(ctx, &cyclonepb.GetRunRequest{RunId: runID}, o...)
		return err
	})
	if err != nil {
		return nil, err
	}
	return runFromProto(resp), nil
}

// ListOptions filter Client.List; the zero value lists the 100 newest runs.
type ListOptions struct {
	States        []string // run state words ("failed", ...); empty: any
	Workflow      string   // empty: any workflow and standalone jobs
	CreatedAfter  time.Time
	CreatedBefore time.Time
	Limit         int // default 100
	IncludeSteps  bool
	Schedule      string
}

// List returns up to Limit runs matching every filter, newest first.
func (c *Client) List(ctx context.Context, opts ListOptions) ([]*Run, error) {
	req := &cyclonepb.ListRunsRequest{Workflow: opts.Workflow, IncludeSteps: opts.IncludeSteps, Schedule: opts.Schedule}
	for _, word := range opts.States {
		v, ok := cyclonepb.RunState_value["RUN_STATE_"+strings.ToUpper(word)]
		if !ok || v == 0 {
			return nil, invalid(fmt.Errorf("states: %q is not a run state (running, paused, completed, failed, cancelled)", word))
		}
		req.States = append(req.States, cyclonepb.RunState(v))
	}
	if !opts.CreatedAfter.IsZero() {
		req.CreatedAfter = timestamppb.New(opts.CreatedAfter)
	}
	if !opts.CreatedBefore.IsZero() {
		req.CreatedBefore = timestamppb.New(opts.CreatedBefore)
	}
	limit := opts.Limit
	if limit <= 0 {
		limit = 100
	}
	var runs []*Run
	for len(runs) < limit {
		req.Limit = int32(min(limit-len(runs), 1000))
		var resp *cyclonepb.ListRunsResponse
		err := c.call(ctx, "ListRuns", 0, func(ctx context.Context, o ...grpc.CallOption) (err error) {
			resp, err = c.runs.ListRuns(ctx, req, o...)
			return err
		})
		if err != nil {
			return nil, err
		}
		for _, r := range resp.Runs {
			runs = append(runs, runFromProto(r))
		}
		if resp.NextPageToken == "" {
			break
		}
		req.PageToken = resp.NextPageToken
	}
	return runs, nil
}

// One WaitRun call waits at most this long; Wait loops, so a long wait survives proxies
// that cut idle calls.
const waitSlice = 30 * time.Second

// Wait blocks until the run is terminal (completed, failed or cancelled) and returns it.
// Bound the wait with ctx: when ctx ends first, Wait returns the run as last read (nil if
// none was) and an error matching ctx.Err() (errors.Is(err, context.DeadlineExceeded)).
func (c *Client) Wait(ctx context.Context, runID string) (*Run, error) {
	var last *Run
	for {
		slice := waitSlice
		if dl, ok := ctx.Deadline(); ok {
			// Leave the server time to answer "timed out" before the caller's deadline.
			left := time.Until(dl)
			left -= min(left/10, time.Second)
			slice = max(0, min(slice, left))
		}
		req := &cyclonepb.WaitRunRequest{RunId: runID, Timeout: durationpb.New(slice)}
		var resp *cyclonepb.WaitRunResponse
		err := c.call(ctx, "WaitRun", slice+c.opts.RPCTimeout, func(ctx context.Context, o ...grpc.CallOption) (err error) {
			resp, err = c.runs.WaitRun(ctx, req, o...)
			return err
		})
		if err != nil {
			return last, err
		}
		last = runFromProto(resp.Run)
		if last.Terminal() {
			return last, nil
		}
		if err := ctx.Err(); err != nil {
			return last, ErrorFromStatus(err)
		}
		if slice == 0 {
			return last, &Error{Code: codes.DeadlineExceeded, Message: fmt.Sprintf("run %s is still %s", runID, last.State)}
		}
	}
}

// Result waits for the run (as Wait) and returns its result: the outputs of its leaf
// nodes by node id. A failed run is *RunFailedError, a cancelled one *RunCancelledError;
// a run still going when ctx ends is Wait's error.
func (c *Client) Result(ctx context.Context, runID string) (map[string]any, error) {
	run, err := c.Wait(ctx, runID)
	if err != nil {
		return nil, err
	}
	switch run.State {
	case "completed":
		if run.Result == nil {
			return map[string]any{}, nil
		}
		return run.Result, nil
	case "failed":
		return nil, &RunFailedError{Run: run}
	}
	return nil, &RunCancelledError{Run: run}
}

// -- actions --------------------------------------------------------------------------------

func (c *Client) action(ctx context.Context, method string, do func(context.Context, ...grpc.CallOption) (*cyclonepb.RunActionResponse, error)) (*Run, error) {
	var resp *cyclonepb.RunActionResponse
	err := c.call(ctx, method, 0, func(ctx context.Context, o ...grpc.CallOption) (err error) {
		resp, err = do(ctx, o...)
		return err
	})
	if err != nil {
		return nil, err
	}
	return runFromProto(resp.Run), nil
}

// Cancel cancels a running or paused run (a no-op on a cancelled one) and returns it.
func (c *Client) Cancel(ctx context.Context, runID string) (*Run, error) {
	return c.action(ctx, "CancelRun", func(ctx context.Context, o ...grpc.CallOption) (*cyclonepb.RunActionResponse, error) {
		return c.runs.CancelRun(ctx, &cyclonepb.CancelRunRequest{RunId: runID}, o...)
	})
}

// Pause pauses a running run: nothing new starts, running steps finish.
func (c *Client) Pause(ctx context.Context, runID string) (*Run, error) {
	return c.action(ctx, "PauseRun", func(ctx context.Context, o ...grpc.CallOption) (*cyclonepb.RunActionResponse, error) {
		return c.runs.PauseRun(ctx, &cyclonepb.PauseRunRequest{RunId: runID}, o...)
	})
}

// Resume resumes a paused run.
func (c *Client) Resume(ctx context.Context, runID string) (*Run, error) {
	return c.action(ctx, "ResumeRun", func(ctx context.Context, o ...grpc.CallOption) (*cyclonepb.RunActionResponse, error) {
		return c.runs.ResumeRun(ctx, &cyclonepb.ResumeRunRequest{RunId: runID}, o...)
	})
}

// Retry reopens the discarded node `node` with a fresh attempt budget. Options:
// Deadline, DeadlineIn (a new run deadline).
func (c *Client) Retry(ctx context.Context, runID, node string, opts ...Option) (*Run, error) {
	s, err := collect("Retry", opts, "Deadline", "DeadlineIn")
	if err != nil {
		return nil, invalid(err)
	}
	req := &cyclonepb.RetryStepRequest{RunId: runID, Node: node}
	req.Deadline, req.DeadlineIn = s.deadlineFields()
	return c.action(ctx, "RetryStep", func(ctx context.Context, o ...grpc.CallOption) (*cyclonepb.RunActionResponse, error) {
		return c.runs.RetryStep(ctx, req, o...)
	})
}

// RetryAll reopens every discarded node of the run. Options: Deadline, DeadlineIn.
func (c *Client) RetryAll(ctx context.Context, runID string, opts ...Option) (*Run, error) {
	s, err := collect("RetryAll", opts, "Deadline", "DeadlineIn")
	if err != nil {
		return nil, invalid(err)
	}
	req := &cyclonepb.RetryAllRequest{RunId: runID}
	req.Deadline, req.DeadlineIn = s.deadlineFields()
	return c.action(ctx, "RetryAll", func(ctx context.Context, o ...grpc.CallOption) (*cyclonepb.RunActionResponse, error) {
		return c.runs.RetryAll(ctx, req, o...)
	})
}

// Signal sends the signal `name` with payload (any JSON value) to a run's mailbox and
// returns the signal's id. The signal node of that name that waits longest consumes it;
// with none waiting, it waits in the mailbox.
func (c *Client) Signal(ctx context.Context, runID, name string, payload any) (string, error) {
	value, err := toValue(payload, "payload", "")
	if err != nil {
		return "", err
	}
	var resp *cyclonepb.SignalResponse
	err = c.call(ctx, "Signal", 0, func(ctx context.Context, o ...grpc.CallOption) (err error) {
		resp, err = c.runs.Signal(ctx, &cyclonepb.SignalRequest{RunId: runID, Name: name, Payload: value}, o...)
		return err
	})
	if err != nil {
		return "", err
	}
	return resp.SignalId, nil
}

// Workers lists the workers connected to any server of the database (those that run
// `kind`, when given).
func (c *Client) Workers(ctx context.Context, kind string) ([]*cyclonepb.WorkerInfo, error) {
	var resp *cyclonepb.ListWorkersResponse
	err := c.call(ctx, "ListWorkers", 0, func(ctx context.Context, o ...grpc.CallOption) (err error) {
		resp, err = c.admin.ListWorkers(ctx, &cyclonepb.ListWorkersRequest{Kind: kind}, o...)
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp.Workers, nil
}
