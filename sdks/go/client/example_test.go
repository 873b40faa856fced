package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/cyclone-workflows/cyclone/sdks/go/client"
)

func Example() {
	ctx := context.Background()
	c, err := client.New(client.Options{Address: "127.0.0.1:7233"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	order := client.NewWorkflow("order").
		Task("reserve").
		Task("charge", client.Deps("reserve"), client.MaxAttempts(5), client.BackoffInitial(2*time.Second)).
		Signal("approval", client.Deps("reserve"), client.MaxWait(24*time.Hour)).
		Sleep("cool-off", time.Hour, client.Deps("approval")).
		Child("ship", "shipping", client.Deps("charge", "cool-off"), client.OnDepFailure(client.CancelBranch))
	if _, err := c.Register(ctx, order); err != nil {
		log.Fatal(err)
	}
	runID, err := c.Submit(ctx, "order", map[string]any{"sku": "book-42"},
		client.IdempotencyKey("order-1001"), client.DeadlineIn(48*time.Hour))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.Signal(ctx, runID, "approval", map[string]any{"by": "ada"}); err != nil {
		log.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	run, err := c.Wait(wctx, runID)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		fmt.Println("still", run.State)
	case err != nil:
		log.Fatal(err)
	case run.State == "failed":
		for _, s := range run.Steps {
			if s.State == "discarded" {
				fmt.Println(s.Node, s.ErrorKind, s.Errors[len(s.Errors)-1].Message)
			}
		}
		if _, err := c.RetryAll(ctx, runID); err != nil {
			log.Fatal(err)
		}
	}
}

func ExampleError() {
	c, err := client.New(client.Options{Address: "127.0.0.1:7233"})
	if err != nil {
		log.Fatal(err)
	}
	_, err = c.Retry(context.Background(), "01a2...", "load")
	var e *client.Error
	switch {
	case errors.Is(err, client.ErrNotFound):
		fmt.Println("no such run or node")
	case errors.Is(err, client.ErrFailedPrecondition):
		fmt.Println("the node is not discarded:", err)
	case errors.As(err, &e):
		fmt.Println("refused:", e.Code, e.Message)
	}
}

func ExampleClient_EnqueueMany() {
	c, err := client.New(client.Options{Address: "127.0.0.1:7233"})
	if err != nil {
		log.Fatal(err)
	}
	jobs := []client.Job{
		{Kind: "resize", Input: map[string]any{"image": "cat.png"}, Options: []client.Option{client.MaxAttempts(3)}},
		{Kind: "resize", Input: map[string]any{"image": "dog.png"}, Options: []client.Option{client.ScheduledIn(time.Minute)}},
	}
	runIDs, err := c.EnqueueMany(context.Background(), jobs) // one call, one transaction: all or none
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(runIDs))
}
