"""Generated protobuf and gRPC code of package cyclone.v1 (proto/cyclone/v1).

Written by scripts/gen_proto.py; do not edit. Import the modules directly, e.g.
``from cyclone_worker._proto import runs_pb2, runs_pb2_grpc``.
"""
