#!/usr/bin/env bash
# The GPU checks: the CUDA-only tests and the GPU benchmark tables, in one command.
#
#   bash scripts/gpu_checks.sh [OUT_DIR]
#
# Needs a machine with an NVIDIA GPU and onnxruntime-gpu in .venv (pip install
# onnxruntime-gpu nvidia-ml-py, after uninstalling onnxruntime). Writes the logs and
# benchmarks JSON to OUT_DIR (default: ./gpu-checks).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu-checks}"
mkdir -p "$out"
py=.venv/bin/python
if ! "$py" -c 'import onnxruntime as o, sys; sys.exit("CUDAExecutionProvider" not in o.get_available_providers())'; then
    echo "onnxruntime in .venv has no CUDAExecutionProvider: pip uninstall onnxruntime && pip install onnxruntime-gpu" >&2
    exit 2
fi
nvidia-smi -L | tee "$out/gpus.txt"
# A failing test must not cost the benchmark tables of the same (rare) GPU lease: both
# run, and the script exits with the first failure's status.
status=0
"$py" -m pytest -q -rs -k "not tensorrt" tests/test_gpu.py tests/test_batch_runs.py tests/test_serving_graph.py 2>&1 | tee "$out/gpu-tests.log" || status=$?
# TensorRT on its own: the engine build runs where TensorrtExecutionProvider starts
# (onnxruntime-gpu and TensorRT's libnvinfer for its CUDA version), the refusal naming
# libnvinfer where the provider is listed without them; -rs says which one this GPU ran.
"$py" -m pytest -q -rs -k tensorrt tests/test_gpu.py 2>&1 | tee "$out/tensorrt-tests.log" || {
    rc=$?
    [ "$status" -ne 0 ] || status=$rc
}
if ! "$py" -m benchmarks.run --only gpu core_throughput core_overhead --json "$out/gpu-benchmarks.json" 2>&1 | tee "$out/gpu-benchmarks.log"; then
    [ "$status" -ne 0 ] || status=1
fi
exit "$status"
