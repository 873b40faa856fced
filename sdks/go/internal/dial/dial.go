// Package dial opens the gRPC connection that the worker and the client share the
// settings of: plaintext or TLS, a bearer token, messages up to 64 MiB, and a reconnect
// within 2 s of a server coming back.
package dial

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
)

// Version is this SDK's version, sent in Hello.sdk ("go/" + Version) and the user agent.
const Version = "0.1.0"

// MaxMessageBytes is the largest message accepted: a lease's payloads as protobuf Values
// take up to 5 or 6 times their JSON size, more than gRPC's default 4 MiB for payloads
// within the server's 1 MiB JSON limit.
const MaxMessageBytes = 64 << 20

// Config says where and how to connect.
type Config struct {
	Address string
	Token   string                           // sent as "authorization: Bearer <token>"; empty: none
	TLS     credentials.TransportCredentials // nil: plaintext
	Extra   []grpc.DialOption                // applied last
}

// Dial opens a connection to cfg.Address; it connects in the background (a wrong address
// shows in the first call, not here).
func Dial(cfg Config) (*grpc.ClientConn, error) {
	if cfg.Address == "" {
		return nil, errors.New("cyclone: no server address (HOST:PORT)")
	}
	opts := []grpc.DialOption{
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes)),
		// gRPC's default backoff grows to two minutes: after a server restart, workers and
		// waiting clients would sit idle that long.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
		grpc.WithUserAgent("cyclone-go/" + Version),
	}
	if cfg.TLS != nil {
		opts = append(opts, grpc.WithTransportCredentials(cfg.TLS))
	} else {
		opts = append(opts, grpc.WithInsecure()) //nolint:staticcheck // also in grpc-go 1.33 (Debian 12), unlike credentials/insecure
	}
	if cfg.Token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer{token: cfg.Token}))
	}
	opts = append(opts, cfg.Extra...)
	return grpc.Dial(cfg.Address, opts...) //nolint:staticcheck // grpc.NewClient is not in grpc-go 1.33
}

type bearer struct{ token string }

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

// RequireTransportSecurity is false: a token over plaintext is the caller's choice (the
// Python SDK allows it too, for a server on localhost or behind a TLS proxy).
func (b bearer) RequireTransportSecurity() bool { return false }
