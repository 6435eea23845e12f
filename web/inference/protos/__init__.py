"""The gRPC front doors' .proto files and the Python modules protoc made from them.

``grpc_service.proto`` is the Open Inference Protocol v2 (``inference.GRPCInferenceService``,
field-compatible with KServe's and Triton's); ``inference_service.proto`` is the seed's
``inference.InferenceService`` (its comments say which fields are the seed's and which
are ours). Clients generate their own stubs from these files. The ``*_pb2`` modules are
generated, committed, and never edited: ``scripts/gen_protos.sh`` makes them, each with a
descriptor pool of its own, so that a Triton client in the same process cannot clash
with them.
"""
