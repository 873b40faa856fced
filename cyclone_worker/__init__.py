"""Cyclone's Python SDK: the worker runtime and the client."""
