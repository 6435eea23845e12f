#!/usr/bin/env bash
# Regenerate the Python modules (*_pb2.py and their *_pb2.pyi stubs) of the gRPC front
# doors' .proto files in web/inference/protos. They are committed; run this after editing
# a .proto (tests/test_oip_grpc.py checks that the committed ones are what it makes).
# Usage: bash scripts/gen_protos.sh [out_dir]   (default: next to the .proto files)
# Needs grpcio-tools (a test dependency); PYTHON chooses the interpreter (.venv's by default).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
protos="$root/web/inference/protos"
out="$(cd "${1:-$protos}" && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
"$python" -m grpc_tools.protoc -I "$protos" --python_out="$out" --pyi_out="$out" \
    grpc_service.proto inference_service.proto
# Each module builds its messages in a descriptor pool of its own instead of protobuf's
# default one: tritonclient (like MLServer and KServe) registers the same inference.*
# names there, and a second definition of a name in one pool fails that import, so
# lipstream and a Triton client could not share a process.
"$python" - "$out"/grpc_service_pb2.py "$out"/inference_service_pb2.py <<'PY'
import sys

default = "_descriptor_pool.Default().AddSerializedFile("
private = "_descriptor_pool.DescriptorPool().AddSerializedFile("
for path in sys.argv[1:]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.count(default) != 1:
        sys.exit(f"{path}: protoc's output changed shape ({default!r} not found once)")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace(default, private))
PY
