"""Triton's ``inference.GRPCInferenceService`` messages, generated from the ``.proto`` files here.

Regenerate with ``scripts/gen_grpc.sh``; ``tests/daemon/test_grpc_proto.py`` checks the wire
format against ``tritonclient.grpc``'s own descriptors.
"""

from cuvil_edge.daemon.proto import grpc_service_pb2, model_config_pb2

__all__ = ["grpc_service_pb2", "model_config_pb2"]
