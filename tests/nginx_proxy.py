"""Debian's nginx as the TLS-terminating reverse proxy in front of a test's lipstream.

The site is ``docs/deploy/nginx.conf`` itself: :func:`render_site` puts the test's values
on the lines an operator changes (listen, server_name, certificate paths, upstream) and
fails if one of them is gone from the file, so the documented config is the tested one.
:func:`run_nginx` includes it in an nginx.conf of the test's own (``daemon off``, pid,
logs and temp files in the test's directory), checks it with ``nginx -t`` and runs nginx
as a subprocess until the test ends. :func:`self_signed` makes the certificate.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import grp
import hashlib
import os
import pwd
import re
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.live_calls import TIMEOUT_S, until

NGINX = Path("/usr/sbin/nginx")
DOCUMENTED_SITE = Path(__file__).parents[1] / "docs" / "deploy" / "nginx.conf"


@dataclass(frozen=True)
class TlsCertificate:
    cert: Path
    key: Path
    #: base64 SHA-256 of the public key, for Chromium's --ignore-certificate-errors-spki-list
    spki_sha256: str


def self_signed(directory: Path, hostname: str) -> TlsCertificate:
    """A P-256 certificate for ``hostname``, valid for a day, and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(hostname)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    spki = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    digest = base64.b64encode(hashlib.sha256(spki).digest()).decode()
    return TlsCertificate(cert_path, key_path, digest)


def render_site(
    text: str,
    *,
    hostname: str,
    https_port: int,
    http_port: int,
    certificate: TlsCertificate,
    upstream: str,
) -> str:
    """The documented site with this test's values on the lines an operator changes."""
    rules = [
        (r"listen 443 ", f"listen 127.0.0.1:{https_port} "),
        (r"listen 80;", f"listen 127.0.0.1:{http_port};"),
        (r"server_name \S+;", f"server_name {hostname};"),
        (r"ssl_certificate \S+;", f"ssl_certificate {certificate.cert};"),
        (r"ssl_certificate_key \S+;", f"ssl_certificate_key {certificate.key};"),
        (r"server 127\.0\.0\.1:8080;", f"server {upstream};"),
    ]
    for pattern, value in rules:
        text = _replace_directive(text, pattern, value)
    return text


def _replace_directive(text: str, pattern: str, value: str) -> str:
    """Each line that starts with the directive ``pattern`` (a comment never does) with
    ``value`` in its place; fails the test if no line does."""

    def replace(match: re.Match[str]) -> str:
        return match.group(1) + value

    text, count = re.subn(rf"^(\s*){pattern}", replace, text, flags=re.M)
    if count == 0:
        pytest.fail(f"{DOCUMENTED_SITE} has no line matching {pattern!r} to render")
    return text


def _nginx_conf(directory: Path, site: Path, proxy_address: str) -> str:
    user = pwd.getpwuid(os.getuid()).pw_name
    group = grp.getgrgid(os.getgid()).gr_name
    return f"""\
daemon off;
# Workers as the test's user (ignored with a warning unless it is root): they write the
# temp files below, in the test's directory.
user {user} {group};
worker_processes 1;
pid {directory}/nginx.pid;
error_log {directory}/error.log info;
events {{
    worker_connections 256;
}}
http {{
    access_log {directory}/access.log;
    client_body_temp_path {directory}/client_body_temp;
    proxy_temp_path {directory}/proxy_temp;
    fastcgi_temp_path {directory}/fastcgi_temp;
    uwsgi_temp_path {directory}/uwsgi_temp;
    scgi_temp_path {directory}/scgi_temp;
    # nginx connects to lipstream from an address of its own, the one trusted proxy, so
    # that lipstream can tell it from a browser on this machine (127.0.0.1).
    proxy_bind {proxy_address};
    include {site};
}}
"""


@dataclass
class Nginx:
    process: asyncio.subprocess.Process
    https_port: int
    http_port: int
    directory: Path

    def log(self) -> str:
        """nginx's error log and stderr, for failure messages."""
        parts = [self.directory / "error.log", self.directory / "stderr.log"]
        return "\n".join(p.read_text(errors="replace") for p in parts if p.exists())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _accepts(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    with suppress(OSError):
        await writer.wait_closed()
    return True


def _configure(
    directory: Path,
    *,
    hostname: str,
    certificate: TlsCertificate,
    upstream: str,
    proxy_address: str,
) -> tuple[list[str], int, int]:
    """Write the rendered site and nginx.conf; nginx's command line and its two ports."""
    if not NGINX.exists():
        pytest.fail(f"{NGINX} is missing: `.ci/run` installs it (apt-get install -y nginx)")
    directory.mkdir(parents=True, exist_ok=True)
    https_port, http_port = free_port(), free_port()
    site = directory / "lipstream-site.conf"
    site.write_text(
        render_site(
            DOCUMENTED_SITE.read_text(),
            hostname=hostname,
            https_port=https_port,
            http_port=http_port,
            certificate=certificate,
            upstream=upstream,
        )
    )
    conf = directory / "nginx.conf"
    conf.write_text(_nginx_conf(directory, site, proxy_address))
    # -e: the error log before the configuration is read (else /var/log/nginx/error.log).
    error_log = directory / "error.log"
    command = [str(NGINX), "-p", str(directory), "-c", str(conf), "-e", str(error_log)]
    return command, https_port, http_port


@asynccontextmanager
async def run_nginx(
    directory: Path,
    *,
    hostname: str,
    certificate: TlsCertificate,
    upstream: str,
    proxy_address: str,
) -> AsyncIterator[Nginx]:
    """nginx serving the documented site for ``hostname`` on free loopback ports, proxying
    to ``upstream`` from ``proxy_address``; stopped (SIGTERM) when the block ends."""
    command, https_port, http_port = _configure(
        directory,
        hostname=hostname,
        certificate=certificate,
        upstream=upstream,
        proxy_address=proxy_address,
    )
    check = await asyncio.create_subprocess_exec(
        *command, "-t", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await check.communicate()
    if check.returncode != 0:
        pytest.fail(f"nginx refused {directory}/nginx.conf:\n{output.decode(errors='replace')}")
    with (directory / "stderr.log").open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.DEVNULL, stdout=stderr, stderr=stderr
        )
    nginx = Nginx(process, https_port, http_port, directory)
    try:

        async def listening() -> bool:
            if process.returncode is not None:
                pytest.fail(f"nginx exited with {process.returncode}:\n{nginx.log()}")
            return await _accepts(https_port) and await _accepts(http_port)

        await until(listening, "nginx to listen", poll_s=0.1)
        yield nginx
    finally:
        if process.returncode is None:
            process.terminate()  # nginx's fast shutdown
            try:
                async with asyncio.timeout(TIMEOUT_S):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()
