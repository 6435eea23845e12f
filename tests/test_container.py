"""The Dockerfile builds an image that serves calls: built and run with Debian's podman.

This machine has no Docker engine, and no registry but the package ones, so the test
cannot pull ``python:3.11-slim``. It builds the base from Debian instead: debootstrap
of bookworm with Python 3.11 (the same Debian release and Python minor as the official
slim image), given this machine's CA bundle so pip in the build trusts what this machine
trusts, imported into podman. It then builds the repository's ``Dockerfile`` unchanged
with ``--build-arg BASE_IMAGE=`` that base, and checks what an operator relies on: a
non-root user, espeak-ng, the health check, a call answered with H.264 from the running
container, and a drain on ``podman stop``.

podman runs rootful here with runc and lowered rlimits (crun refuses this VM's hybrid
cgroups, and neither runtime may raise RLIMIT_NOFILE/NPROC to podman's defaults).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import ClientSession

from tests.live_calls import until
from tests.server_process import answers, free_port
from tests.webrtc_client import Caller

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
BASE = "localhost/lipstream-test-base:bookworm"
MIRROR = "http://deb.debian.org/debian"
PODMAN = ["podman", "--runtime", "runc"]
ULIMITS = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def _require_tools() -> None:
    missing = [t for t in ("podman", "runc", "debootstrap") if shutil.which(t) is None]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not found: the container test needs Debian's podman, runc "
            "and debootstrap (`.ci/run` installs them: apt-get install podman runc debootstrap)"
        )


def _run(*argv: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    assert done.returncode == 0, f"{' '.join(argv)} failed:\n{done.stdout[-3000:]}{done.stderr}"
    return done


@pytest.fixture(scope="module")
def base_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Debian bookworm with python3 and venv, as a local podman image (made once per
    machine: it holds nothing of lipstream's)."""
    _require_tools()
    if subprocess.run(["podman", "image", "exists", BASE], check=False).returncode == 0:
        return BASE
    root = tmp_path_factory.mktemp("rootfs") / "bookworm"
    _run(
        "debootstrap",
        "--variant=minbase",
        "--include=python3,python3-venv,ca-certificates",
        "bookworm",
        str(root),
        MIRROR,
        timeout_s=900,
    )
    if CA_BUNDLE.exists():
        shutil.copyfile(CA_BUNDLE, root / CA_BUNDLE.relative_to("/"))
    tarball = root.with_suffix(".tar")
    _run("tar", "-C", str(root), "-cf", str(tarball), ".")
    _run("podman", "import", str(tarball), BASE)
    tarball.unlink()
    shutil.rmtree(root, ignore_errors=True)
    return BASE


def _build(base_image: str, tag: str, *build_args: str, timeout_s: float = 900) -> None:
    """Build the repository's Dockerfile, unchanged, as ``tag`` on ``base_image``."""
    _run(
        *PODMAN,
        "build",
        "--format",
        "docker",  # HEALTHCHECK is part of the Docker image format, not OCI's
        "--network",
        "host",
        *ULIMITS,
        "--build-arg",
        f"BASE_IMAGE={base_image}",
        *(arg for value in build_args for arg in ("--build-arg", value)),
        "-t",
        tag,
        str(REPO),
        timeout_s=timeout_s,
    )


def _start(image: str, port: int, name: str) -> None:
    """Run ``image`` detached with host networking, serving on ``port``."""
    _run(
        *PODMAN,
        "run",
        "-d",
        "--name",
        name,
        "--network",
        "host",
        *ULIMITS,
        "-e",
        f"LIPSTREAM_SERVER__PORT={port}",
        # This sandbox has only loopback for ICE (tests/conftest.py, ``loopback``).
        "-e",
        "LIPSTREAM_SERVER__ICE_LOOPBACK_ONLY=true",
        "-e",
        "LIPSTREAM_SERVER__DRAIN_TIMEOUT_S=3",
        image,
    )


@pytest.fixture(scope="module")
def image(base_image: str) -> Iterator[str]:
    """The repository's Dockerfile, built unchanged on ``base_image``."""
    tag = f"localhost/lipstream:test-{os.getpid()}"
    _build(base_image, tag)
    try:
        yield tag
    finally:
        subprocess.run(["podman", "rmi", "-f", tag], capture_output=True, check=False)


def test_the_image_runs_as_a_user_with_a_health_check_and_espeak(image: str) -> None:
    inspected = json.loads(_run("podman", "image", "inspect", image).stdout)[0]
    config = inspected["Config"]
    assert config["User"] == "lipstream"
    assert inspected["Healthcheck"]["Test"] == ["CMD", "lipstream", "health", "--timeout", "5"]
    assert config["Cmd"] == ["lipstream", "serve"]
    assert "8080/tcp" in config["ExposedPorts"]
    uid = _run(*PODMAN, "run", "--rm", *ULIMITS, image, "id", "-u").stdout.strip()
    assert uid != "0"
    espeak = _run(*PODMAN, "run", "--rm", *ULIMITS, image, "espeak-ng", "--version").stdout
    assert "eSpeak NG" in espeak


@pytest.fixture
def container(image: str) -> Iterator[tuple[str, int]]:
    """The image running with host networking on a free port; removed at the end."""
    port = free_port()
    name = f"lipstream-test-{os.getpid()}-{port}"
    _start(image, port, name)
    try:
        yield name, port
    finally:
        subprocess.run(["podman", "rm", "-f", name], capture_output=True, check=False)


async def test_the_container_serves_a_call_and_drains_on_stop(
    container: tuple[str, int], loopback: None
) -> None:
    name, port = container
    async with ClientSession(base_url=f"http://127.0.0.1:{port}") as http:
        await until(lambda: answers(http, "/health"), "the container's /health", timeout_s=180)
        health = await asyncio.to_thread(
            subprocess.run, ["podman", "healthcheck", "run", name], capture_output=True
        )
        assert health.returncode == 0, health.stderr  # the image's own HEALTHCHECK command
        caller = Caller(http)
        caller.keep_luma = False
        await caller.connect()
        try:
            await caller.wait_for_frames(25)
            assert caller.received.video_codec == "video/H264"
        finally:
            await caller.close()
    stopped = await asyncio.to_thread(
        subprocess.run, ["podman", "stop", "-t", "30", name], capture_output=True, text=True
    )
    assert stopped.returncode == 0, stopped.stderr
    inspected = await asyncio.to_thread(_run, "podman", "inspect", name)
    state = json.loads(inspected.stdout)[0]["State"]
    logs = (await asyncio.to_thread(_run, "podman", "logs", name)).stderr
    assert state["ExitCode"] == 0, logs  # SIGTERM drained and exited, not killed
    assert "server stopped" in logs, logs
    assert "Traceback" not in logs, logs


@pytest.fixture(scope="module")
def cuda_image(base_image: str) -> Iterator[str]:
    """The Dockerfile's CUDA flavour (``--build-arg FLAVOUR=cuda``) on ``base_image``."""
    tag = f"localhost/lipstream:test-cuda-{os.getpid()}"
    _build(base_image, tag, "FLAVOUR=cuda", timeout_s=1200)
    try:
        yield tag
    finally:
        subprocess.run(["podman", "rmi", "-f", tag], capture_output=True, check=False)


async def test_the_cuda_image_offers_cuda_and_serves_on_the_cpu_without_a_gpu(
    cuda_image: str, loopback: None
) -> None:
    """Built with onnxruntime-gpu and its CUDA/cuDNN libraries from the package index;
    on this machine (no GPU, no driver) it says so once and answers a call on the CPU."""
    check = (
        "import ctypes, onnxruntime as o; print(o.get_available_providers()); "
        "ctypes.CDLL('libcudnn.so.9'); ctypes.CDLL('libcublasLt.so.13'); "
        "ctypes.CDLL('libcudart.so.13'); import pynvml; print('libraries ok')"
    )
    probe = await asyncio.to_thread(
        _run, *PODMAN, "run", "--rm", *ULIMITS, cuda_image, "python3", "-c", check
    )
    assert "CUDAExecutionProvider" in probe.stdout, probe.stdout
    assert "libraries ok" in probe.stdout, probe.stdout
    port = free_port()
    name = f"lipstream-test-cuda-{os.getpid()}-{port}"
    await asyncio.to_thread(_start, cuda_image, port, name)
    try:
        async with ClientSession(base_url=f"http://127.0.0.1:{port}") as http:
            try:
                await until(lambda: answers(http, "/health"), "/health", timeout_s=180)
            except BaseException:
                logs = await asyncio.to_thread(
                    subprocess.run, ["podman", "logs", name], capture_output=True, text=True
                )
                pytest.fail(f"the CUDA container did not answer /health:\n{logs.stderr[-4000:]}")
            caller = Caller(http)
            caller.keep_luma = False
            await caller.connect()
            try:
                await caller.wait_for_frames(25)
                assert caller.received.video_codec == "video/H264"
            finally:
                await caller.close()
        logs = (await asyncio.to_thread(_run, "podman", "logs", name)).stderr
        fallback = [line for line in logs.splitlines() if "no GPU visible" in line]
        assert len(fallback) == 1, logs  # said once
        assert "cpu:0" in fallback[0]
        assert "libcuda.so.1" in fallback[0]
        assert "Traceback" not in logs, logs
    finally:
        await asyncio.to_thread(
            subprocess.run, ["podman", "rm", "-f", name], capture_output=True, check=False
        )
