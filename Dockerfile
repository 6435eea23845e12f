# The lipstream server as a container image (docs/operations/deployment.md, "Container").
#
#   docker build -t lipstream .            # or: podman build --format docker -t lipstream .
#   docker run --network host -v lipstream:/var/lib/lipstream lipstream
#
#   docker build --build-arg FLAVOUR=cuda -t lipstream:cuda .      # NVIDIA GPUs
#   docker run --gpus all --network host -v lipstream:/var/lib/lipstream lipstream:cuda
#   podman run --device nvidia.com/gpu=all --network host ... lipstream:cuda   # CDI
#
# WebRTC media travels over UDP on ports aiortc picks per call from the kernel's
# ephemeral range (net.ipv4.ip_local_port_range), so run the container with host
# networking, or publish only 8080/tcp and carry media through TURN (turn.urls +
# turn.secret; compose.yaml runs coturn beside it).
#
# FLAVOUR=cpu (the default) runs inference on the CPU. FLAVOUR=cuda installs onnxruntime-gpu
# with the CUDA 13 and cuDNN 9 libraries it loads, from the package index (no CUDA base
# image: only the host's driver is needed, which --gpus or CDI mounts in), and NVML for
# per-GPU memory. Started without a GPU it says so once and serves on the CPU
# (devices.kind auto). docs/operations/deployment.md, "GPU image", has the run lines and MPS notes.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

# espeak-ng: the built-in text-to-speech engine ("say"); the rest is in the wheels.
RUN apt-get update \
    && apt-get install -y --no-install-recommends espeak-ng \
    && rm -rf /var/lib/apt/lists/*

ENV VIRTUAL_ENV=/opt/lipstream \
    PATH=/opt/lipstream/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/lipstream

# Dependencies first, from pyproject.toml alone: a code change does not re-install them.
# Those both flavours share come first, so that building the other flavour reuses them
# (FLAVOUR is declared after them: it is no part of their layer's cache key).
WORKDIR /src
COPY pyproject.toml README.md ./
RUN python3 -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > requirements.txt \
    && grep -v '^onnxruntime[<>=!~ ]' requirements.txt > shared.txt \
    && pip install -r shared.txt
ARG FLAVOUR=cpu
RUN grep '^onnxruntime[<>=!~ ]' requirements.txt > runtime.txt \
    && case "$FLAVOUR" in \
         cpu) ;; \
         cuda) sed -i 's/^onnxruntime\([<>=!~ ]\)/onnxruntime-gpu[cuda,cudnn]\1/' runtime.txt \
               && printf '%s\n' 'nvidia-cublas~=13.0' 'nvidia-ml-py>=12' >> runtime.txt ;; \
         *) echo "FLAVOUR must be cpu or cuda, not '$FLAVOUR'" >&2; exit 1 ;; \
       esac \
    && pip install -r runtime.txt \
    && if [ "$FLAVOUR" = cuda ]; then \
         find /opt/lipstream -path '*/nvidia/*' -name 'lib*.so*' -printf '%h\n' | sort -u \
           > /etc/ld.so.conf.d/lipstream-nvidia.conf && ldconfig; \
       fi
COPY config config
COPY inference_core inference_core
COPY compositor compositor
COPY streaming streaming
COPY web web
RUN pip install --no-deps . && cd / && rm -rf /src

# A system user owns the data: the generated demo avatar, imported avatars, caches.
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/lipstream --create-home \
    --shell /usr/sbin/nologin lipstream
USER lipstream
WORKDIR /var/lib/lipstream
# What the NVIDIA container toolkit mounts for --gpus (compute, and nvidia-smi/NVML).
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
LABEL org.opencontainers.image.title="lipstream" io.lipstream.flavour="${FLAVOUR}"
ENV LIPSTREAM_SERVER__HOST=0.0.0.0 \
    LIPSTREAM_AVATARS__ROOT=/var/lib/lipstream/avatars \
    LIPSTREAM_AVATARS__DATA_DIR=/var/lib/lipstream/data
VOLUME ["/var/lib/lipstream"]
# 8080: HTTP (signalling, admin, /v1/infer, OIP REST); 8081: gRPC (OIP and the seed's
# InferenceService; server.grpc_port).
EXPOSE 8080/tcp 8081/tcp

# A generous start period: the first start may generate the demo avatar into the volume.
HEALTHCHECK --interval=30s --timeout=10s --start-period=180s --retries=3 \
    CMD ["lipstream", "health", "--timeout", "5"]
# SIGTERM drains live calls for server.drain_timeout_s (default 30 s): stop with a longer
# grace period (docker stop -t 40; compose.yaml sets stop_grace_period).
STOPSIGNAL SIGTERM
CMD ["lipstream", "serve"]
