"""Real object-store protocol servers for the tests, started on 127.0.0.1 with a free port and stopped after.

S3: moto in server mode (``ThreadedMotoServer``: the S3 REST API, multipart uploads included), reached by
s3fs through ``AWS_ENDPOINT_URL`` as a user's client reaches it. GCS: gcp-storage-emulator's HTTP server,
reached by gcsfs through ``STORAGE_EMULATOR_HOST``. Each test gets a bucket of its own (``new_bucket``);
the servers live for the session (a few hundred ms to start). Azure: Azurite's blob server (the npm package,
installed into tests/azurite/ by the README's test command), reached by adlfs through AZURE_STORAGE_CONNECTION_STRING;
where node or the package is missing its tests skip, saying so. Child processes inherit the variables, so a
training killed with SIGKILL in a subprocess talks to the same server.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import uuid
from collections.abc import Iterator

S3_ENVIRONMENT = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def moto_s3_server() -> Iterator[str]:
    """An S3 server (moto) on loopback; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one access-log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@contextlib.contextmanager
def gcs_emulator_server() -> Iterator[str]:
    """A GCS JSON-API server (gcp-storage-emulator, in memory) on loopback; yields its endpoint URL."""
    from gcp_storage_emulator import server as emulator
    from gcp_storage_emulator.server import create_server

    logging.getLogger("gcp_storage_emulator").setLevel(logging.WARNING)
    emulator._read_data = _byte_exact_multipart(emulator._read_data)
    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    httpd = server._api._httpd
    # http.server listens with socketserver's backlog of 5: a client's burst of parallel requests then waits out a
    # 1 s SYN retry per dropped connection. Listening again on Linux only raises the backlog.
    httpd.socket.listen(128)
    report = httpd.handle_error

    def handle_error(request, client_address):
        # A client that stops reading a ranged GET early closes the connection: not the emulator's fault to print.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            report(request, client_address)

    httpd.handle_error = handle_error
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def _byte_exact_multipart(read_data):
    """The emulator's request-body reader, with a ``multipart/related`` upload (gcsfs's one-request upload of a
    small file) split on its boundary byte for byte.

    The emulator hands such bodies to the ``email`` parser, which takes a lone ``\\r`` for a line end: an object
    whose last byte is 0x0d is stored one byte short (1 upload in 256 of random bytes, e.g. an event record's
    CRC). Real GCS keeps every byte, so the tests' server must too.
    """
    import base64

    from gcp_storage_emulator.server import _decode_raw_data, _read_raw_data

    def read(request_handler, query):
        content_type = request_handler.headers.get("Content-Type") or ""
        if not content_type.startswith("multipart/related"):
            return read_data(request_handler, query)
        raw = _decode_raw_data(_read_raw_data(request_handler), request_handler)
        if not raw:
            return None
        boundary = content_type.split("boundary=", 1)[1].split(";", 1)[0].strip().strip('"').encode()
        delimiter = b"--" + boundary
        start = raw.index(delimiter)
        # gcsfs ends its lines with LF alone, other clients with CRLF: the first delimiter line says which.
        newline = b"\r\n" if raw[start + len(delimiter) :].startswith(b"\r\n") else b"\n"
        parts = []
        for piece in raw[start + len(delimiter) :].split(newline + delimiter)[:-1]:  # the last is the closing "--"
            head, body = piece[len(newline) :].split(newline * 2, 1)
            headers = {
                name.strip().lower(): value.strip()
                for name, _, value in (line.decode().partition(":") for line in head.split(newline) if line)
            }
            if headers.get("content-transfer-encoding", "").lower() == "base64":
                body = base64.b64decode(body)
            parts.append((headers, body))
        (_, meta), (content_headers, content) = parts
        content_type_of_part = content_headers.get("content-type", "application/octet-stream").split(";", 1)[0]
        return {"meta": json.loads(meta), "content": content, "content-type": content_type_of_part}

    return read


def new_bucket(protocol: str) -> str:
    """A fresh, empty bucket on the server the environment points at; returns ``protocol://name``."""
    from torchestimator._io import filesystems

    name = f"te-{uuid.uuid4().hex[:12]}"
    fs, _ = filesystems.filesystem(f"{protocol}://{name}")
    fs.mkdir(name)
    return f"{protocol}://{name}"


def s3_environment(endpoint: str) -> dict[str, str]:
    return {**S3_ENVIRONMENT, "AWS_ENDPOINT_URL": endpoint}


def gcs_environment(endpoint: str) -> dict[str, str]:
    return {"STORAGE_EMULATOR_HOST": endpoint, "GOOGLE_CLOUD_PROJECT": "test-project"}


def forget_filesystems() -> None:
    """Drop the filesystems made so far (ours and fsspec's instance cache): the next use reads the environment."""
    import fsspec

    from torchestimator._io import filesystems

    filesystems.configure_storage_options(None)
    for name in ("s3", "gcs", "abfs"):
        try:
            fsspec.get_filesystem_class(name).clear_instance_cache()
        except (ImportError, ValueError):
            pass


AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
"""Azurite's well-known development account (published in its documentation; not a secret)."""
AZURITE_BIN = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "azurite", "node_modules", ".bin", "azurite-blob"
)
"""Installed by the README's test command: ``npm ci --prefix tests/azurite`` (package-lock.json pins it)."""


def azurite_missing() -> str | None:
    """Why Azurite cannot run here, or None."""
    import shutil

    if shutil.which("node") is None:
        return "node is not installed, so Azurite (the Azure Storage emulator, an npm package) cannot run"
    if not os.path.exists(AZURITE_BIN):
        return (
            f"Azurite is not installed at {AZURITE_BIN} (the README's test command runs npm ci --prefix tests/azurite)"
        )
    return None


@contextlib.contextmanager
def azurite_server(workdir: str) -> Iterator[str]:
    """Azurite's blob service on loopback, its data in ``workdir``; yields its connection string."""
    import subprocess
    import time

    port = free_port()
    log = open(os.path.join(workdir, "azurite.log"), "wb")
    server = subprocess.Popen(
        [
            AZURITE_BIN,
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(port),
            "--location",
            workdir,
            "--silent",
            "--skipApiVersionCheck",
            "--loose",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Azurite did not start (exit {server.poll()}); see {workdir}/azurite.log")
            time.sleep(0.1)
        yield (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};"
        )
    finally:
        # Killed, not asked: on SIGTERM Azurite waits for the clients' keep-alive connections to close (30 s here),
        # and its data is this test session's temporary folder.
        server.kill()
        server.wait(timeout=30)
        log.close()


def azure_environment(connection_string: str) -> dict[str, str]:
    return {"AZURE_STORAGE_CONNECTION_STRING": connection_string}


def upload_version(local_version: str, url: str, *, metadata: bool = True, damage: str | None = None) -> str:
    """Puts a local export version's files under ``url`` as another tool would (``aws s3 sync``); without
    metadata.json it is an upload still in progress; ``damage`` names a file whose last byte is flipped."""
    from torchestimator._io import filesystems
    from torchestimator.export import _store_versions

    for relative in _store_versions.file_records(local_version):
        with open(os.path.join(local_version, relative), "rb") as handle:
            data = handle.read()
        if relative == damage:
            data = data[:-1] + bytes([data[-1] ^ 1])
        filesystems.write_bytes(f"{url}/{relative}", data)
    if metadata:
        with open(os.path.join(local_version, "metadata.json"), "rb") as handle:
            filesystems.write_bytes(f"{url}/metadata.json", handle.read())
    return url
