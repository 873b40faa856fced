package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/cyclone-workflows/cyclone/sdks/go/client"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.New(client.Options{Address: "127.0.0.1:7233"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Register(ctx, client.NewWorkflow("hello").Task("greet")); err != nil {
		log.Fatal(err) // registering the same definition again is a no-op
	}
	runID, err := c.Submit(ctx, "hello", map[string]any{"name": "Ada"})
	if err != nil {
		log.Fatal(err)
	}
	result, err := c.Result(ctx, runID) // waits; a failed run is a *client.RunFailedError
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(result["greet"]) // map[greeting:hello Ada]
}
