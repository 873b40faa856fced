"""Assembles a server process: settings, the gRPC server, metrics, background work and processes."""
