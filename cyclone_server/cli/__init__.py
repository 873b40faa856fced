"""The `cyclone` and `cyclone-server` commands; operator commands reach a server over gRPC only."""
