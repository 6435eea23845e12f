"""Raw inference over the standard protocols (``docs/design/inference-protocols.md`` §17).

``contract`` says what a model's tensors look like over a protocol (two versions: the
model's own float interface and the serving graph's uint8 one); ``door`` is the one way
into the inference core every front door takes (``/v1/infer``, the Open Inference
Protocol v2 over REST and gRPC, the seed's ``InferenceService``). ``rest`` serves the
protocol's ``/v2`` on the HTTP port; ``binary_tensors`` is its requests and answers on the
wire (JSON tensors and the binary tensor extension). ``grpc_server`` is the gRPC listener
and its message limits; ``oip_grpc`` the protocol's gRPC service and ``seed_grpc`` the
seed's ``InferenceService`` on it; ``grpc_status`` their shared errors, admin rule and
handler registration; ``grpc_wire`` the wire bytes of the calls that carry tensors, read
and written without copying them (the cluster front's model scan walks them too);
``protos`` the ``.proto`` files and the code generated from them.
"""

from web.inference.contract import VERSIONS, Contract, TensorInfo, Version, contract
from web.inference.door import InferenceDoor, InferResult, ModelStatistics

__all__ = [
    "VERSIONS",
    "Contract",
    "InferResult",
    "InferenceDoor",
    "ModelStatistics",
    "TensorInfo",
    "Version",
    "contract",
]
