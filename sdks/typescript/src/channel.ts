// Every channel to a Cyclone server (the worker's and the client's): address, TLS, limits.

import * as grpc from '@grpc/grpc-js';

/** Messages up to this size each way: a lease's payloads as protobuf Values can be several times their JSON size. */
export const MAX_MESSAGE_BYTES = 64 * 1024 * 1024;

/** Options shared by Worker and Client for the connection. */
export interface ConnectionOptions {
  /** A bearer token, sent as `authorization: Bearer ...` on every call (servers with auth). */
  token?: string;
  /** TLS: `grpc.credentials.createSsl(...)`. Default: plaintext. */
  credentials?: grpc.ChannelCredentials;
  /** More @grpc/grpc-js channel options; they win over the SDK's. */
  channelOptions?: grpc.ChannelOptions;
}

export function channelOptions(extra: grpc.ChannelOptions = {}): grpc.ChannelOptions {
  return {
    // After a server restart, reconnect within a second or two (gRPC's default backoff
    // grows to two minutes, which would leave workers and waiting clients idle).
    'grpc.initial_reconnect_backoff_ms': 100,
    'grpc.max_reconnect_backoff_ms': 2000,
    'grpc.max_receive_message_length': MAX_MESSAGE_BYTES,
    'grpc.max_send_message_length': MAX_MESSAGE_BYTES,
    // No client keepalive pings: a server that allows fewer answers with GOAWAY; the worker
    // stream detects a dead connection with its own Ping/Pong instead.
    ...extra,
  };
}

/** A channel to `address` (HOST:PORT). */
export function openChannel(address: string, options: ConnectionOptions): grpc.Channel {
  checkAddress(address);
  return new grpc.Channel(address, options.credentials ?? grpc.credentials.createInsecure(),
    channelOptions(options.channelOptions));
}

/** Refuses an address that is not HOST:PORT (a URL, say) before gRPC tries it. */
export function checkAddress(address: string): void {
  if (typeof address !== 'string' || address === '' || /^[a-z]+:\/\//i.test(address)) {
    throw new TypeError(`address: ${JSON.stringify(address)} is not HOST:PORT (for example 127.0.0.1:7233)`);
  }
}

/** Call metadata with the bearer token, if any. */
export function authMetadata(token: string | undefined): grpc.Metadata {
  const md = new grpc.Metadata();
  if (token) md.set('authorization', `Bearer ${token}`);
  return md;
}
