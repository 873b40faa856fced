"""Cyclone's control plane: the Postgres state machine and the gRPC server in front of it."""
