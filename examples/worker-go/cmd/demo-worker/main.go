// Command demo-worker is a Cyclone worker on the Go SDK (sdks/go) whose behaviour per
// step kind is scripted on the command line, so that tests can make it succeed, fail,
// snooze, wait for a Stop, hang until killed, start child runs or send signals.
//
//	demo-worker --address 127.0.0.1:7233 --slots 2 --marker-dir /tmp/m \
//	  --kind extract=succeed --kind flaky=fail:2 --kind slowretry=faildelay:2:300 \
//	  --kind broken=permanent --kind later=snooze:0.5 --kind slow=block --kind nap=sleep:2 \
//	  --kind stuck=hang --kind traced=trace --kind parent=submit:child-wf --kind ping=signal:go
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cyclone-workflows/cyclone/sdks/go/client"
	"github.com/cyclone-workflows/cyclone/sdks/go/worker"
)

const lang = "go"

type kindFlags []string

func (k *kindFlags) String() string     { return strings.Join(*k, ",") }
func (k *kindFlags) Set(v string) error { *k = append(*k, v); return nil }

// demo holds what the behaviours share.
type demo struct {
	address, token, markerDir, workerID string

	clientOnce sync.Once
	client     *client.Client
	clientErr  error
}

// derive is the output of a succeeding step: the run input's "value" for a root node,
// else the sum of the parents' values, plus one; and which language made each parent.
func (d *demo) derive(l *worker.Lease) any {
	base := 0.0
	from := map[string]any{}
	if len(l.Parents) == 0 {
		if in, ok := l.Input.(map[string]any); ok {
			base, _ = in["value"].(float64)
		}
	}
	for node, out := range l.Parents {
		o, _ := out.(map[string]any)
		v, _ := o["value"].(float64)
		base += v
		from[node] = o["lang"]
	}
	return map[string]any{
		"lang": lang, "worker": d.workerID, "node": l.Node, "attempt": l.Attempt, "value": base + 1, "from": from,
	}
}

// cyclone is the SDK client on the worker's own server address (and token), made once.
func (d *demo) cyclone() (*client.Client, error) {
	d.clientOnce.Do(func() {
		d.client, d.clientErr = client.New(client.Options{Address: d.address, Token: d.token})
	})
	return d.client, d.clientErr
}

func (d *demo) marker(l *worker.Lease, suffix, text string) {
	_ = os.WriteFile(filepath.Join(d.markerDir, l.StepID+"."+suffix), []byte(text), 0o644)
}

func explode(node string) {
	panic("demo explosion in " + node)
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func (d *demo) behaviour(spec string) (worker.Handler, error) {
	name, arg, _ := strings.Cut(spec, ":")
	switch name {
	case "succeed":
		return func(_ context.Context, l *worker.Lease) (any, error) { return d.derive(l), nil }, nil
	case "fail":
		times, err := strconv.Atoi(arg)
		if err != nil {
			return nil, fmt.Errorf("fail:N wants a count: %w", err)
		}
		return func(_ context.Context, l *worker.Lease) (any, error) {
			if l.Attempt <= times {
				return nil, worker.RetryAfter(fmt.Errorf("planned failure %d of %d", l.Attempt, times), 100*time.Millisecond)
			}
			return d.derive(l), nil
		}, nil
	case "faildelay":
		// faildelay:N:MS fails the first N attempts asking for a retry after MS ms
		// (Failed.retry_delay), then succeeds as succeed does.
		n, ms, _ := strings.Cut(arg, ":")
		times, err1 := strconv.Atoi(n)
		delay, err2 := strconv.Atoi(ms)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("faildelay:N:MS wants two counts, got %q", arg)
		}
		return func(_ context.Context, l *worker.Lease) (any, error) {
			if l.Attempt <= times {
				return nil, worker.RetryAfter(fmt.Errorf("planned failure %d of %d, retry in %d ms", l.Attempt, times, delay),
					time.Duration(delay)*time.Millisecond)
			}
			return d.derive(l), nil
		}, nil
	case "permanent":
		return func(_ context.Context, l *worker.Lease) (any, error) {
			return nil, worker.Permanent(fmt.Errorf("planned permanent failure of %s", l.Node))
		}, nil
	case "panic":
		// A panic two calls deep: the worker sends its goroutine's stack as Failed.details.
		return func(_ context.Context, l *worker.Lease) (any, error) {
			explode(l.Node)
			return nil, nil
		}, nil
	case "snooze":
		secs, err := strconv.ParseFloat(arg, 64)
		if err != nil {
			return nil, fmt.Errorf("snooze:SECONDS wants a number: %w", err)
		}
		// Snoozes once: the lease says how often the step was snoozed already.
		return func(_ context.Context, l *worker.Lease) (any, error) {
			if l.Snoozes == 0 {
				return nil, worker.Snooze(seconds(secs))
			}
			return d.derive(l), nil
		}, nil
	case "block":
		return func(ctx context.Context, l *worker.Lease) (any, error) {
			d.marker(l, "started", d.workerID)
			<-ctx.Done()
			d.marker(l, "stopped", l.StopReason())
			return nil, context.Cause(ctx)
		}, nil
	case "sleep":
		secs, err := strconv.ParseFloat(arg, 64)
		if err != nil {
			return nil, fmt.Errorf("sleep:SECONDS wants a number: %w", err)
		}
		// Succeeds after a while, even across a lost stream; marks when it is done.
		return func(ctx context.Context, l *worker.Lease) (any, error) {
			d.marker(l, "started", d.workerID)
			select {
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			case <-time.After(seconds(secs)):
			}
			d.marker(l, "done", d.workerID)
			return d.derive(l), nil
		}, nil
	case "big":
		// Returns {"blob": "xxx..."} of BYTES characters: over the server's payload limit,
		// the worker sends only its size and the step is discarded (output_too_large).
		n, err := strconv.Atoi(arg)
		if err != nil {
			return nil, fmt.Errorf("big:BYTES wants a count: %w", err)
		}
		return func(context.Context, *worker.Lease) (any, error) {
			return map[string]string{"blob": strings.Repeat("x", n)}, nil
		}, nil
	case "trace":
		// Returns the trace context the handler got, as parsed from the lease and as its
		// context.Context carries it.
		return func(ctx context.Context, l *worker.Lease) (any, error) {
			out := map[string]any{"lang": lang, "traceparent": "", "from_context": worker.TraceFromContext(ctx) == l.Trace}
			if t := l.Trace; t != nil {
				out["traceparent"], out["tracestate"], out["trace_id"], out["span_id"], out["sampled"] =
					t.Traceparent, t.Tracestate, t.TraceID, t.SpanID, t.Sampled
			}
			return out, nil
		}, nil
	case "hang":
		return func(_ context.Context, l *worker.Lease) (any, error) {
			d.marker(l, "started", d.workerID)
			select {} // until the process is killed
		}, nil
	case "submit":
		// submit:WORKFLOW starts a run of WORKFLOW through the SDK client, waits for it, and
		// returns its id and result. The handler's context carries the lease's trace
		// context, so the child run joins the trace.
		if arg == "" {
			return nil, errors.New("submit:WORKFLOW wants a workflow name")
		}
		return func(ctx context.Context, l *worker.Lease) (any, error) {
			c, err := d.cyclone()
			if err != nil {
				return nil, err
			}
			runID, err := c.Submit(ctx, arg, map[string]any{"parent_step": l.StepID})
			if err != nil {
				return nil, fmt.Errorf("submitting %s: %w", arg, err)
			}
			result, err := c.Result(ctx, runID)
			if err != nil {
				return nil, fmt.Errorf("waiting for run %s: %w", runID, err)
			}
			return map[string]any{"lang": lang, "child_run": runID, "child_result": result}, nil
		}, nil
	case "signal":
		// signal:NAME sends the signal NAME to the handler's own run, then succeeds.
		if arg == "" {
			return nil, errors.New("signal:NAME wants a signal name")
		}
		return func(ctx context.Context, l *worker.Lease) (any, error) {
			c, err := d.cyclone()
			if err != nil {
				return nil, err
			}
			if _, err := c.Signal(ctx, l.RunID, arg, map[string]any{"from": lang, "step": l.StepID}); err != nil {
				return nil, fmt.Errorf("signalling %s: %w", arg, err)
			}
			return d.derive(l), nil
		}, nil
	}
	return nil, errors.New("unknown behaviour " + strconv.Quote(spec) + ": succeed, fail:N, faildelay:N:MS, permanent, " +
		"panic, snooze:SECONDS, block, sleep:SECONDS, big:BYTES, trace, hang, submit:WORKFLOW or signal:NAME")
}

func main() {
	var kinds kindFlags
	d := &demo{}
	flag.StringVar(&d.address, "address", envOr("CYCLONE_ADDRESS", "127.0.0.1:7233"), "server HOST:PORT")
	flag.StringVar(&d.workerID, "worker-id", envOr("CYCLONE_WORKER_ID", fmt.Sprintf("go-demo-%d", os.Getpid())), "worker id")
	flag.StringVar(&d.token, "token", os.Getenv("CYCLONE_TOKEN"), "bearer token, for a server with auth")
	flag.StringVar(&d.markerDir, "marker-dir", envOr("CYCLONE_MARKER_DIR", "."), "where block/sleep/hang write <step_id>.started, .stopped, .done")
	slots := flag.Int("slots", 1, "leases held at once")
	grace := flag.Duration("grace", 10*time.Second, "how long running handlers get to finish on SIGTERM")
	flag.Var(&kinds, "kind", "NAME=BEHAVIOUR, repeatable (also CYCLONE_KINDS, comma-separated)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if env := os.Getenv("CYCLONE_KINDS"); env != "" && len(kinds) == 0 {
		kinds = strings.Split(env, ",")
	}
	if len(kinds) == 0 {
		fail(log, "give at least one --kind NAME=BEHAVIOUR")
	}
	w := worker.New(worker.Options{Address: d.address, Token: d.token, WorkerID: d.workerID, Slots: *slots,
		Grace: *grace, Logger: log})
	for _, spec := range kinds {
		kind, behaviour, ok := strings.Cut(spec, "=")
		if !ok || kind == "" {
			fail(log, fmt.Sprintf("--kind wants NAME=BEHAVIOUR, got %q", spec))
		}
		h, err := d.behaviour(behaviour)
		if err != nil {
			fail(log, err.Error())
		}
		w.Handle(kind, h)
	}
	err := w.RunUntilSignal()  // SIGTERM or Ctrl-C: a graceful stop
	d.clientOnce.Do(func() {}) // no client is made from now on: d.client may be read
	if d.client != nil {
		d.client.Close()
	}
	if err != nil {
		fail(log, err.Error())
	}
}

func fail(log *slog.Logger, msg string) {
	log.Error(msg)
	os.Exit(1)
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}
