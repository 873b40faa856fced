"""Generated protobuf and gRPC code of package cyclone.v1 (proto/cyclone/v1).

A public package by design: the server, the Python SDK and any Python program that
talks to Cyclone import the wire contract from here, e.g.
``from cyclone_proto import runs_pb2, runs_pb2_grpc``.

Written by scripts/gen_proto.py; do not edit.
"""
