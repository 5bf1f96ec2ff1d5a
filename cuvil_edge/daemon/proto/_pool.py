"""The descriptor pool of the daemon's gRPC messages.

Our ``.proto`` files reuse Triton's package and message names (``inference.ModelInferRequest``)
so stock clients talk to the daemon; ``tritonclient.grpc`` registers the same names in protobuf's
default pool. A pool of our own lets both live in one process.
"""

from google.protobuf import descriptor_pool

__all__ = ["POOL"]

POOL = descriptor_pool.DescriptorPool()
