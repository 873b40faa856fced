package worker_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/cyclone-workflows/cyclone/sdks/go/client"
	"github.com/cyclone-workflows/cyclone/sdks/go/worker"
)

// A handler whose work stops when the server says Stop (the run was cancelled, the
// attempt timed out, the lease was fenced): pass ctx on, or watch ctx.Done().
func Example_cancellation() {
	w := worker.New(worker.Options{Address: "127.0.0.1:7233"})
	w.Handle("fetch", func(ctx context.Context, l *worker.Lease) (any, error) {
		var in struct{ URL string }
		if err := l.DecodeInput(&in); err != nil {
			return nil, worker.Permanent(err)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, in.URL, nil)
		if err != nil {
			return nil, worker.Permanent(err)
		}
		resp, err := http.DefaultClient.Do(req) // cancelled with ctx
		if err != nil {
			var stop *worker.StopError
			if errors.As(context.Cause(ctx), &stop) {
				l.Log.Info("stopped", "reason", stop.Reason) // "cancelled", "timeout", ...
			}
			return nil, err // a retryable failure (not sent at all when stopped)
		}
		defer resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusTooManyRequests:
			return nil, worker.RetryAfter(errors.New("rate limited"), 30*time.Second)
		case resp.StatusCode == http.StatusAccepted:
			return nil, worker.Snooze(10 * time.Second) // not ready: run again later, not a failure
		case resp.StatusCode >= 400:
			return nil, worker.Permanent(fmt.Errorf("GET %s: %s", in.URL, resp.Status))
		}
		return map[string]any{"status": resp.StatusCode, "bytes": resp.ContentLength}, nil
	})
	if err := w.RunUntilSignal(); err != nil {
		log.Fatal(err)
	}
}

// A handler that starts a child run and waits for it: the client call made with the
// handler's ctx carries the lease's trace context, so the child run joins the trace.
func Example_submitFromAHandler() {
	c, err := client.New(client.Options{Address: "127.0.0.1:7233"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	w := worker.New(worker.Options{Address: "127.0.0.1:7233"})
	w.Handle("fan-out", func(ctx context.Context, l *worker.Lease) (any, error) {
		runID, err := c.Submit(ctx, "resize-all", l.Input, client.IdempotencyKey("fan-out-"+l.StepID))
		if err != nil {
			return nil, err
		}
		return c.Result(ctx, runID)
	})
	if err := w.RunUntilSignal(); err != nil {
		log.Fatal(err)
	}
}
