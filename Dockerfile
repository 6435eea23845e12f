# The lipstream server as a container image (docs/deployment.md, "Container").
#
#   docker build -t lipstream .            # or: podman build --format docker -t lipstream .
#   docker run --network host -v lipstream:/var/lib/lipstream lipstream
#
# WebRTC media travels over UDP on ports aiortc picks per call from the kernel's
# ephemeral range (net.ipv4.ip_local_port_range), so run the container with host
# networking, or publish only 8080/tcp and carry media through TURN (turn.urls +
# turn.secret; compose.yaml runs coturn beside it). The image runs on the CPU; for
# NVIDIA GPUs build FROM a CUDA runtime base and install onnxruntime-gpu (see the docs).
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
WORKDIR /src
COPY pyproject.toml README.md ./
RUN python3 -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > requirements.txt \
    && pip install -r requirements.txt
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
