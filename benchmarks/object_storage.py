"""Benchmark: object storage against local disk, measured in the same run on the same bytes.

Stores (`--store s3|gs|both`, default both, one after the other):

- s3: moto's S3 server, started here in a process of its own on 127.0.0.1 (so its Python does not share a
  GIL with the reader), or any S3 endpoint given with `--endpoint` (and `--bucket`; credentials from the
  usual AWS_* variables); the floors are s3fs's.
- gs: gcp-storage-emulator's GCS JSON API server (in memory), likewise in a process of its own on
  127.0.0.1, reached by gcsfs through STORAGE_EMULATOR_HOST; the floors are gcsfs's. The emulator is
  Python's single-threaded http.server speaking HTTP/1.0: one request at a time, a connection per request;
  its listen backlog is raised from socketserver's 5 to 128 (`EMULATOR_BACKLOG`: with 5, concurrent
  requests lost SYNs and waited 1 s each).

One function per measurement, each returning its key=value pairs; `main()` calls those in `MEASUREMENTS`
for each store and prints one last line per store (checkpoint and upload measurements are added there the
same way).

tfrecord (issue 27, point 4; target tfrecord_vs_local >= 0.8): `--mb` MB of generated tf.train.Examples
(an int64 label, 64 floats, `--record-bytes` of image bytes) in `--files` TFRecord files, written once
locally and uploaded byte for byte. Each round reads every file once through:

- local:      `TFRecordDataset(local files, batch_size=B)` (records counted per batch: the reading only);
- s3 / gs:    the same over the `s3://` / `gs://` URLs (torchestimator's ranged read-ahead, `data/_remote_files.py`);
- s3fs_get / gcsfs_get: the client's plain `cat` of the same objects, all at once (no parsing: the most this
              server gives a client, the floor it imposes on any reader);
- s3fs_ranged / gcsfs_ranged: the client's `cat_ranges` of the same objects in the ranges our reader fetches
              (16 MiB), all at once: on moto every ranged GET reads the whole object server-side (its
              `FakeKey.value`), and on the emulator too (it slices the whole object it reads), a cost real
              stores do not have, so this is the floor for ranged reads on this server;
- interleaved local/store: `interleave_cycle_length=--files` (the files fetched in parallel);
- parsed local/store: `features=` parsing each batch (what an input_fn hands the loop);
- tfdata:     tf.data reading the same objects from the same server: `tf.data.TFRecordDataset(urls)
              .batch(B).prefetch(AUTOTUNE)`, the records counted per batch in Python as ours are, in a
              TensorFlow process of its own (kept across rounds; asked for each round's read over a pipe).
              TF's GCS client reads a file in 64 MiB blocks (GCS_READ_CACHE_BLOCK_SIZE_MB), one GET each, one
              after the other;
- proxied_get (gs, with tfdata): a plain GET of the same objects, all at once, through the TLS proxy tf.data
              goes through (below): the floor of tf.data's path, which ours does not take.

tf.data needs TensorFlow, which is not in the project's lock: `--tensorflow-python PATH` names an interpreter
that imports it (a venv with `pip install tensorflow-cpu`, or benchmarks/requirements-bench.txt), else this
interpreter is used when it imports tensorflow; without either, or where TensorFlow cannot reach the store,
a line says why and the last line has tfrecord_vs_tfdata=n/a. What TensorFlow 2.21 can reach, and how:

- gs: TF's built-in GCS file system (tsl/platform/cloud/gcs_file_system.cc) has no endpoint setting: its
  URLs are fixed (https://www.googleapis.com/storage/v1/ for metadata, https://storage.googleapis.com/
  BUCKET/OBJECT for ranged reads; neither STORAGE_EMULATOR_HOST nor any GCS_* variable moves them). It
  does read, through its libcurl, HTTPS_PROXY and CURL_CA_BUNDLE, and GOOGLE_AUTH_TOKEN_FOR_TESTING (a
  fixed bearer token: no credentials, no metadata server; NO_GCE_CHECK=true). So this script runs a TLS
  proxy of its own (a process of its own on 127.0.0.1): it answers each CONNECT, ends TLS with a
  certificate for both hosts signed by a CA made for the run (the CA file is TensorFlow's CURL_CA_BUNDLE)
  and passes the plain bytes to the emulator, which serves both URL forms. tf.data thus pays TLS and one
  more hop (a Python process) that our reader does not: proxied_get measures that path's floor, and the
  printed tfdata_vs_proxied_get is tf.data's share of it (compare tfrecord_vs_gcsfs_get) and
  proxied_get_vs_gcsfs_get what the path costs (0.34 to 0.56 in four runs at 128 MB here: a 32 MB GET
  takes 60-90 ms through the proxy, 15 ms direct, curl's or ours). So tfrecord_vs_tfdata on gs overstates our
  lead by up to that much: it is the ratio on this path, not what tf.data would do against a store it could
  reach directly (tf.data used 0.23 to 0.61 of this path's floor in those runs). GCS_READ_CACHE_MAX_SIZE_MB=0
  (TF's default) is set explicitly: no round is served from an earlier round's blocks.
- s3: not measured. TensorFlow 2.x registers only file, ram and gs (tf.io.gfile.get_registered_schemes());
  S3 moved to tensorflow-io, whose newest release on PyPI (0.37.1) requires tensorflow<2.17, and whose
  file-system plugins fail to load into 2.21 (undefined symbols), so s3:// stays unregistered. Should a
  TensorFlow with s3 be given, it is tried (S3_ENDPOINT and friends, tensorflow-io's settings).

gcsfs's default filesystem (ExtendedGcsFileSystem, GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT) asks Google's
storage-control API for a bucket's type at every file it opens; against the emulator that fails (no
credentials) and is not cached, about 10 ms an open here, paid by our reader (not by gcsfs's cat, the
floor); the warning it logs each time is dropped and counted in one line. Against real GCS the lookup
succeeds once per bucket and is cached. `GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false python benchmarks/...`
measures with the plain GCSFileSystem: in one run each, tfrecord_vs_gcsfs_get was 0.82 with it and 0.38
with the default.

Rounds rotate the order; the first `--warmup-rounds` are dropped; a ratio is the median over rounds of
ours/theirs in the same round (throughput: bytes per second). Before timing, the records read from the
store (by us and by tf.data) are checked equal to the local ones (exit 1 otherwise). When the server's
floor (s3fs_get_vs_local / gcsfs_get_vs_local) is itself below the target, a line says so: the ratio then
measures the server, not the reader.

checkpoint (issue 27, point 2): a checkpoint of `--checkpoint-mb` MB of model tensors and as much optimizer
state, saved and restored through CheckpointStore on local disk and on the server (the commit protocol
without rename: a fresh prefix, state.json, the manifest), against the client's plain put/get of the same
files (the server's floor); upload_gbps is our save's rate; list_calls_per_save counts the listing requests
of one save with 50 checkpoints kept (bounded: not one per kept checkpoint).

Run:  python benchmarks/object_storage.py [--store both] [--mb 128] [--files 4] [--rounds 3]
          [--tensorflow-python /tmp/tfvenv/bin/python] [--endpoint URL --bucket NAME]
Last lines (one per store; on gs the s3fs in each key is gcsfs):
    object_storage store=s3 tfrecord_vs_local=<ratio> tfrecord_vs_s3fs_get=<ratio> tfrecord_vs_s3fs_ranged=<ratio>
    tfrecord_vs_tfdata=<ratio|n/a> interleaved_vs_local=<ratio> parsed_vs_local=<ratio> s3fs_get_vs_local=<ratio>
    ckpt_save_vs_local=<ratio> ckpt_load_vs_local=<ratio> ckpt_save_vs_s3fs_put=<ratio>
    ckpt_load_vs_s3fs_get=<ratio> upload_gbps=<Gbit/s> list_calls_per_save=<n>
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import hashlib
import http.client
import importlib.util
import json
import logging
import os
import select
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from torchestimator._io import filesystems
from torchestimator.data._remote_files import CHUNK_SIZE
from torchestimator.data.example import encode_example
from torchestimator.data.parsing import FixedLenFeature
from torchestimator.data.tfrecord import TFRecordWriter
from torchestimator.data.tfrecord_dataset import TFRecordDataset

TARGETS = {"tfrecord_vs_local": 0.8}
"""Issue 27's target: TFRecords from a store at >= 0.8x the speed of the same files on local disk."""
FEATURES = {
    "label": FixedLenFeature([], "int64"),
    "dense": FixedLenFeature([64], "float"),
    "image": FixedLenFeature([], "string"),
}
MOTO_ENVIRONMENT = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
CLIENTS = {"s3": "s3fs", "gs": "gcsfs"}
"""The fsspec client of each store: its plain get/put are the floors, and it names those keys."""
GCS_HOSTS = ("www.googleapis.com", "storage.googleapis.com")
"""Where TensorFlow's GCS file system sends its requests (fixed in its source): the proxy's certificate names both."""
TENSORFLOW_TIMEOUT = 600.0
"""Seconds the TensorFlow process may take for one answer (its import, a digest, a round's read)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """What the command line chose."""

    mb: float
    """Megabytes of TFRecords, all files together."""
    files: int
    rounds: int
    """Timed rounds (after the warm-up ones)."""
    warmup_rounds: int
    batch_size: int
    record_bytes: int
    """Bytes of the image feature of each Example (the rest is about 300 bytes)."""
    endpoint: str | None
    """An S3 endpoint to use instead of starting moto's server."""
    bucket: str | None
    seed: int
    checkpoint_mb: float
    """Megabytes of model tensors in the checkpoint measurement (the optimizer state adds as much)."""
    stores: tuple[str, ...] = ("s3", "gs")
    """The stores measured, in this order (`--store`)."""
    tensorflow_python: str | None = None
    """An interpreter that imports tensorflow, for tf.data; None: this one if it does, else tf.data is not measured."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Store:
    """What every measurement gets: the settings, a local scratch folder and a bucket URL on the server."""

    settings: Settings
    local_dir: str
    bucket_url: str
    endpoint: str
    protocol: str = "s3"
    """s3 or gs: the URL scheme, and the store's name on its last line."""

    @property
    def client(self) -> str:
        """s3fs or gcsfs: the fsspec client whose plain get/put are this store's floors."""
        return CLIENTS[self.protocol]


def parse_settings(argv: list[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--store",
        choices=("s3", "gs", "both"),
        default="both",
        help="the S3 server (moto's), the GCS emulator, or both (default)",
    )
    parser.add_argument("--mb", type=float, default=128.0, help="MB of TFRecords (default 128)")
    parser.add_argument("--files", type=int, default=4, help="TFRecord files (default 4)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (default 3)")
    parser.add_argument("--warmup-rounds", type=int, default=1, help="rounds dropped first (default 1)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--record-bytes", type=int, default=4096, help="image bytes per Example (default 4096)")
    parser.add_argument("--endpoint", default=None, help="an S3 endpoint URL instead of a moto server")
    parser.add_argument("--bucket", default=None, help="with --endpoint: an existing bucket to write into")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-mb", type=float, default=64.0, help="MB of model tensors (default 64)")
    parser.add_argument(
        "--tensorflow-python",
        default=None,
        metavar="PATH",
        help="a Python that imports tensorflow, for the tf.data comparison (default: this one, if it does)",
    )
    parser.add_argument("--quick", action="store_true", help="8 MB, 2 files, 1 round: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.mb, args.files, args.rounds, args.warmup_rounds, args.checkpoint_mb = 8.0, 2, 1, 0, 8.0
    for name in ("files", "rounds", "batch_size", "record_bytes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.mb <= 0:
        parser.error("--mb must be above 0")
    if args.warmup_rounds < 0:
        parser.error("--warmup-rounds must be at least 0")
    if (args.endpoint is None) != (args.bucket is None):
        parser.error("--endpoint and --bucket go together")
    if args.endpoint is not None and args.store == "gs":
        parser.error("--endpoint and --bucket name an S3 server: they need --store s3 or both")
    if args.tensorflow_python is not None and shutil.which(args.tensorflow_python) is None:
        parser.error(f"--tensorflow-python {args.tensorflow_python}: no such program")
    return Settings(
        mb=args.mb,
        files=args.files,
        rounds=args.rounds,
        warmup_rounds=args.warmup_rounds,
        batch_size=args.batch_size,
        record_bytes=args.record_bytes,
        endpoint=args.endpoint,
        bucket=args.bucket,
        seed=args.seed,
        checkpoint_mb=args.checkpoint_mb,
        stores=("s3", "gs") if args.store == "both" else (args.store,),
        tensorflow_python=args.tensorflow_python,
    )


# --------------------------------------------------------------------------- the servers


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def _server_process(command: list[str], port: int, name: str) -> Iterator[str]:
    """A server started as ``command`` in a process of its own, listening on ``port``; yields its URL."""
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start on port {port} (exit {server.poll()}); is it installed?")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def moto_server() -> contextlib.AbstractContextManager[str]:
    """moto's S3 server in its own process on loopback; yields its endpoint URL."""
    port = _free_port()
    return _server_process(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        port,
        "moto's S3 server (moto[server])",
    )


EMULATOR_BACKLOG = 128
"""The emulator's listen backlog. It serves with http.server.HTTPServer, whose backlog is socketserver's 5: more
connections at once than that (a cat_ranges of 8 ranges, an interleave's read-ahead) overflow it, and each dropped
SYN costs the client a 1 s retransmit (measured: every gcsfs_ranged round took 1.05 s). werkzeug's server, moto's,
listens with 128; so does the emulator here."""
GCS_EMULATOR_MAIN = (
    f"import http.server, sys; http.server.HTTPServer.request_queue_size = {EMULATOR_BACKLOG}; "
    "from gcp_storage_emulator.__main__ import main; main(sys.argv[1:])"
)


def gcs_emulator() -> contextlib.AbstractContextManager[str]:
    """gcp-storage-emulator in its own process on loopback, in memory, its backlog raised; yields its endpoint URL."""
    port = _free_port()
    return _server_process(
        [
            sys.executable,
            "-c",
            GCS_EMULATOR_MAIN,
            "start",
            "-H",
            "127.0.0.1",
            "--port",
            str(port),
            "--in-memory",
            "--quiet",
        ],
        port,
        "gcp-storage-emulator",
    )


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` set in os.environ while inside; the previous values (or their absence) restored after."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _forget_filesystems(protocol: str) -> None:
    """The filesystems made for this store's server go with it (ours and fsspec's instance cache)."""
    import fsspec

    filesystems.configure_storage_options(None)
    with contextlib.suppress(ImportError, ValueError):
        fsspec.get_filesystem_class(protocol).clear_instance_cache()


class _BucketTypeLookups(logging.Filter):
    """Drops gcsfs's warning that it could not tell a bucket's type (and counts them)."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("Could not determine bucket type"):
            self.dropped += 1
            return False
        return True


@contextlib.contextmanager
def _quiet_bucket_type_lookups() -> Iterator[None]:
    """gcsfs's default filesystem (ExtendedGcsFileSystem) asks Google's storage-control API for a bucket's type
    when it opens a file; against the emulator that fails (no credentials), is not cached, and logs a warning
    on every open: those warnings are dropped here and counted in one line."""
    lookups = _BucketTypeLookups()
    logger = logging.getLogger("gcsfs")
    logger.addFilter(lookups)
    try:
        yield
    finally:
        logger.removeFilter(lookups)
        if lookups.dropped:
            print(
                f"gcsfs: {lookups.dropped} failed bucket-type lookups (one per file opened or written: "
                "ExtendedGcsFileSystem asks the storage-control API, which the emulator lacks; warnings dropped)"
            )


@contextlib.contextmanager
def open_store(settings: Settings, protocol: str) -> Iterator[Store]:
    """The server (moto's or the GCS emulator, unless --endpoint), a bucket on it, a local scratch folder;
    both emptied after, the environment that pointed the clients there restored."""
    local_dir = tempfile.mkdtemp(prefix="object-storage-bench-")
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, local_dir, True)
        stack.callback(_forget_filesystems, protocol)
        if protocol == "gs":
            stack.enter_context(_quiet_bucket_type_lookups())
            endpoint = stack.enter_context(gcs_emulator())
            stack.enter_context(
                _environment({"STORAGE_EMULATOR_HOST": endpoint, "GOOGLE_CLOUD_PROJECT": "test-project"})
            )
        elif settings.endpoint is None:
            endpoint = stack.enter_context(moto_server())
            stack.enter_context(_environment({**MOTO_ENVIRONMENT, "AWS_ENDPOINT_URL": endpoint}))
        else:
            endpoint = settings.endpoint
            stack.enter_context(_environment({"AWS_ENDPOINT_URL": endpoint}))
        if protocol == "s3" and settings.endpoint is not None:
            bucket_url = f"s3://{settings.bucket}/te-bench-{uuid.uuid4().hex[:8]}"
            stack.callback(filesystems.remove_tree, bucket_url)
        else:
            bucket = f"te-bench-{uuid.uuid4().hex[:8]}"
            fs, _ = filesystems.filesystem(f"{protocol}://{bucket}")
            fs.mkdir(bucket)
            bucket_url = f"{protocol}://{bucket}"
        yield Store(settings=settings, local_dir=local_dir, bucket_url=bucket_url, endpoint=endpoint, protocol=protocol)


def s3_store(settings: Settings) -> contextlib.AbstractContextManager[Store]:
    return open_store(settings, "s3")


# --------------------------------------------------------------------------- timing


def timed(read: Callable[[], int]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of this process, what `read` returned)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = read()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def run_rounds(settings: Settings, readers: dict[str, Callable[[], int]]) -> dict[str, list[float]]:
    """Wall seconds per reader per kept round; the order rotates each round."""
    names = list(readers)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(settings.warmup_rounds + settings.rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            wall, _, _ = timed(readers[name])
            if round_index >= settings.warmup_rounds:
                seconds[name].append(wall)
    return seconds


def ratio(seconds: dict[str, list[float]], ours: str, theirs: str) -> float:
    """Median over rounds of ours' throughput / theirs' (the same bytes: their time / ours)."""
    return statistics.median(t / o for o, t in zip(seconds[ours], seconds[theirs]))


# --------------------------------------------------------------------------- tf.data in a TensorFlow process

TENSORFLOW_CHILD = r"""
import hashlib, json, sys
answers, sys.stdout = sys.stdout, sys.stderr  # what TensorFlow prints goes to the log, not into the answers
def answer(**message):
    answers.write(json.dumps(message) + "\n")
    answers.flush()
try:
    import tensorflow as tf
except Exception as error:
    answer(ok=False, error=f"import tensorflow failed: {type(error).__name__}: {error}")
    raise SystemExit(1)
schemes = getattr(tf.io.gfile, "get_registered_schemes", lambda: [])()
answer(ok=True, version=tf.__version__, schemes=sorted(scheme for scheme in schemes if scheme))
for line in sys.stdin:
    request = json.loads(line)
    try:
        dataset = tf.data.TFRecordDataset(request["urls"])
        if request["op"] == "digest":
            digest = hashlib.sha256()
            for record in dataset.as_numpy_iterator():
                digest.update(record)
            answer(ok=True, value=digest.hexdigest())
        else:
            count = 0
            for batch in dataset.batch(request["batch_size"]).prefetch(tf.data.AUTOTUNE):
                count += int(batch.shape[0])
            answer(ok=True, value=count)
    except Exception as error:
        answer(ok=False, error=f"{type(error).__name__}: {error}"[:2000])
"""
"""The TensorFlow side: says its version and file systems, then answers one JSON line per request line."""


class TensorFlowUnavailable(Exception):
    """Why tf.data cannot be measured here (the message is printed, the last line gets n/a)."""


class TensorFlowProcess:
    """A Python that imports tensorflow, in a process of its own, reading TFRecords with tf.data when asked."""

    def __init__(self, python: str, environment: dict[str, str], log_path: str) -> None:
        self.python, self.log_path = python, log_path
        self._log = open(log_path, "wb")
        self._process = subprocess.Popen(
            [python, "-c", TENSORFLOW_CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env={**os.environ, **environment},
        )
        try:
            hello = self._answer()
        except TensorFlowUnavailable:
            self.close()
            raise
        self.version: str = hello["version"]
        self.schemes: list[str] = hello["schemes"]

    def _answer(self) -> dict[str, Any]:
        ready, _, _ = select.select([self._process.stdout], [], [], TENSORFLOW_TIMEOUT)
        line = self._process.stdout.readline() if ready else ""
        if not line:
            why = "did not answer in time" if not ready else f"exited ({self._process.poll()})"
            raise TensorFlowUnavailable(f"the TensorFlow process ({self.python}) {why}: {self._log_tail()}")
        message = json.loads(line)
        if not message.get("ok"):
            raise TensorFlowUnavailable(f"{message['error']} ({self.python})")
        return message

    def _log_tail(self) -> str:
        self._log.flush()
        with open(self.log_path, "rb") as log:
            lines = log.read().decode(errors="replace").strip().splitlines()
        return " | ".join(lines[-3:]) or "nothing on stderr"

    def ask(self, **request: Any) -> Any:
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        return self._answer()["value"]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._process.stdin.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._log.close()


def tensorflow_python(settings: Settings) -> str:
    """The interpreter for tf.data: --tensorflow-python, else this one if it imports tensorflow."""
    if settings.tensorflow_python is not None:
        return settings.tensorflow_python
    if importlib.util.find_spec("tensorflow") is not None:
        return sys.executable
    raise TensorFlowUnavailable(
        "no TensorFlow: this Python does not import tensorflow (it is not in the project's "
        "lock); give --tensorflow-python PATH, a Python that does (pip install tensorflow-cpu "
        "into a venv of its own, or benchmarks/requirements-bench.txt)"
    )


def _tls_files(folder: str) -> tuple[str, str, str]:
    """A CA made for this run and a certificate it signed for TensorFlow's GCS hosts: (CA, certificate, key) paths."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    os.makedirs(folder, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "object_storage benchmark CA (one run)")])
    usage = dict.fromkeys(
        (
            "digital_signature",
            "content_commitment",
            "key_encipherment",
            "data_encipherment",
            "key_agreement",
            "key_cert_sign",
            "crl_sign",
            "encipher_only",
            "decipher_only",
        ),
        False,
    )
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(**{**usage, "digital_signature": True, "key_cert_sign": True, "crl_sign": True}),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, GCS_HOSTS[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host) for host in GCS_HOSTS]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(**{**usage, "digital_signature": True}), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = tuple(os.path.join(folder, name) for name in ("ca.pem", "cert.pem", "key.pem"))
    for path, data in zip(
        paths,
        (
            ca.public_bytes(serialization.Encoding.PEM),
            certificate.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            ),
        ),
    ):
        with open(path, "wb") as file:
            file.write(data)
    return paths


def serve_tls_proxy(upstream_port: int, certificate: str, key: str) -> None:
    """An HTTPS proxy for TensorFlow's GCS client (run in a process of its own: ``--serve-tls-proxy``). It prints
    its port, then answers each CONNECT, ends TLS with ``certificate`` and passes the bytes both ways between
    the client and 127.0.0.1:``upstream_port`` (the emulator, plain HTTP) until either side closes."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificate, key)

    def pipe(source: socket.socket, target: socket.socket) -> None:
        buffer = memoryview(bytearray(4 << 20))
        try:
            while size := source.recv_into(buffer):
                target.sendall(buffer[:size])
        except OSError:
            pass
        for end in (source, target):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def tunnel(client: socket.socket) -> None:
        with client:
            head = b""
            while b"\r\n\r\n" not in head:
                data = client.recv(65536)
                if not data:
                    return
                head += data
            if not head.startswith(b"CONNECT "):
                client.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                return
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            try:
                secure = context.wrap_socket(client, server_side=True)
            except (OSError, ssl.SSLError):
                return
            with secure, socket.create_connection(("127.0.0.1", upstream_port)) as upstream:
                back = threading.Thread(target=pipe, args=(upstream, secure), daemon=True)
                back.start()
                pipe(secure, upstream)
                back.join()

    listener = socket.create_server(("127.0.0.1", 0), backlog=128)
    print(listener.getsockname()[1], flush=True)
    while True:
        client, _ = listener.accept()
        threading.Thread(target=tunnel, args=(client,), daemon=True).start()


@contextlib.contextmanager
def tls_proxy(store: Store) -> Iterator[tuple[int, str]]:
    """serve_tls_proxy in its own process, in front of the store's emulator; yields (its port, the CA's path)."""
    ca, certificate, key = _tls_files(os.path.join(store.local_dir, "tls"))
    upstream = urllib.parse.urlsplit(store.endpoint).port
    proxy = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--serve-tls-proxy", str(upstream), certificate, key],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        ready, _, _ = select.select([proxy.stdout], [], [], 120)
        port = proxy.stdout.readline().strip() if ready else ""
        if not port.isdigit():
            raise TensorFlowUnavailable(
                f"the TLS proxy in front of the GCS emulator did not start (exit {proxy.poll()})"
            )
        yield int(port), ca
    finally:
        proxy.terminate()
        proxy.wait(timeout=30)


def _proxied_get(urls: list[str], port: int, ca: str) -> Callable[[], int]:
    """A plain GET of every object at once through the TLS proxy, as TensorFlow's client reaches them."""
    context = ssl.create_default_context(cafile=ca)

    def fetch(url: str) -> int:
        connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=120)
        connection.set_tunnel(GCS_HOSTS[1], 443)
        try:
            connection.request("GET", "/" + urllib.parse.quote(url.split("://", 1)[1]))
            response = connection.getresponse()
            data = response.read()
        finally:
            connection.close()
        if response.status != 200:
            raise RuntimeError(f"GET {url} through the TLS proxy: HTTP {response.status}")
        return len(data)

    def read() -> int:
        with ThreadPoolExecutor(len(urls)) as pool:
            return sum(pool.map(fetch, urls))

    return read


def tensorflow_readers(
    store: Store, stack: contextlib.ExitStack, urls: list[str], local: list[str]
) -> tuple[dict[str, Callable[[], int]], str]:
    """The readers tf.data adds to this store's rounds ({} when it cannot be measured) and a line saying how, or
    why not; the processes it starts (TensorFlow's, the TLS proxy) end with ``stack``."""
    settings = store.settings
    try:
        python = tensorflow_python(settings)
        environment = {"TF_CPP_MIN_LOG_LEVEL": "2"}
        proxy: tuple[int, str] | None = None
        if store.protocol == "gs":
            proxy = stack.enter_context(tls_proxy(store))
            environment.update(
                {
                    "HTTPS_PROXY": f"http://127.0.0.1:{proxy[0]}",
                    "https_proxy": f"http://127.0.0.1:{proxy[0]}",
                    "NO_PROXY": "",
                    "no_proxy": "",
                    "CURL_CA_BUNDLE": proxy[1],
                    "GOOGLE_AUTH_TOKEN_FOR_TESTING": "the-emulator-takes-any-token",
                    "NO_GCE_CHECK": "true",
                    "GCS_READ_CACHE_MAX_SIZE_MB": "0",
                    "GCS_RETRY_CONFIG_MAX_RETRIES": "2",
                }
            )
        else:
            endpoint = urllib.parse.urlsplit(store.endpoint)
            environment.update(
                {
                    "S3_ENDPOINT": endpoint.netloc,
                    "S3_USE_HTTPS": str(int(endpoint.scheme == "https")),
                    "S3_VERIFY_SSL": "0",
                    "AWS_REGION": os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
                }
            )
        process = TensorFlowProcess(python, environment, os.path.join(store.local_dir, "tensorflow.log"))
        stack.callback(process.close)
        if store.protocol not in process.schemes:
            why = (
                " (TF 2.x moved S3 to tensorflow-io, whose newest release, 0.37.1, requires tensorflow<2.17; its "
                "file-system plugins do not load into later ones)"
                if store.protocol == "s3"
                else ""
            )
            raise TensorFlowUnavailable(
                f"TensorFlow {process.version} at {python} has no {store.protocol}:// file "
                f"system (it has {', '.join(process.schemes) or 'none listed'}){why}"
            )
        digest = process.ask(op="digest", urls=urls)
        if digest != _records_digest(local, settings.batch_size):
            print("FAILED: the records tf.data read from the store differ from the local ones", file=sys.stderr)
            raise SystemExit(1)
    except TensorFlowUnavailable as error:
        return {}, f"tf.data: not measured on {store.protocol}: {error}"
    readers = {"tfdata": lambda: process.ask(op="count", urls=urls, batch_size=settings.batch_size)}
    how = (
        f"tf.data: TensorFlow {process.version} ({python}), tf.data.TFRecordDataset(urls)"
        f".batch({settings.batch_size}).prefetch(AUTOTUNE), the same records"
    )
    if proxy is not None:
        readers["proxied_get"] = _proxied_get(urls, *proxy)
        how += (
            f"; TF's GCS client reaches the emulator through a TLS proxy (its URLs are fixed to "
            f"{' and '.join(GCS_HOSTS)}): HTTPS_PROXY, CURL_CA_BUNDLE, GOOGLE_AUTH_TOKEN_FOR_TESTING"
        )
    return readers, how


# --------------------------------------------------------------------------- tfrecord


def write_tfrecords(store: Store) -> tuple[list[str], list[str], int]:
    """The generated files, locally and uploaded: (local paths, URLs, total bytes)."""
    settings = store.settings
    rng = np.random.default_rng(settings.seed)
    image = rng.integers(0, 256, size=settings.record_bytes * 2, dtype=np.uint8).tobytes()
    example_bytes = settings.record_bytes + 64 * 5 + 40
    per_file = max(int(settings.mb * 1e6 / example_bytes / settings.files), 1)
    local, urls, total = [], [], 0
    for file_index in range(settings.files):
        path = os.path.join(store.local_dir, f"train-{file_index:05d}-of-{settings.files:05d}.tfrecord")
        dense = rng.standard_normal((per_file, 64)).astype(np.float32)
        with TFRecordWriter(path) as writer:
            for index in range(per_file):
                start = (index * 7) % settings.record_bytes
                writer.write(
                    encode_example(
                        {
                            "label": [index % 1000],
                            "dense": dense[index],
                            "image": [image[start : start + settings.record_bytes]],
                        }
                    )
                )
        with open(path, "rb") as file:
            data = file.read()
        total += len(data)
        local.append(path)
        urls.append(f"{store.bucket_url}/{os.path.basename(path)}")
        filesystems.write_bytes(urls[-1], data)
    return local, urls, total


def _records_digest(files: list[str], batch_size: int) -> str:
    digest = hashlib.sha256()
    for batch in TFRecordDataset(files, batch_size=batch_size, collate_fn=list):
        for record in batch:
            digest.update(record)
    return digest.hexdigest()


def _count(files: list[str], **options: Any) -> Callable[[], int]:
    def read() -> int:
        return sum(TFRecordDataset(files, collate_fn=len, **options))

    return read


def _parsed(files: list[str], batch_size: int) -> Callable[[], int]:
    def read() -> int:
        return sum(
            len(labels)
            for _, labels in TFRecordDataset(files, features=FEATURES, label_key="label", batch_size=batch_size)
        )

    return read


def _client_get(urls: list[str]) -> Callable[[], int]:
    fs, _ = filesystems.filesystem(urls[0])
    inner = [fs._strip_protocol(url) for url in urls]

    def read() -> int:
        return sum(map(len, fs.cat(inner).values()))  # every object at once, as s3fs and gcsfs fetch a list

    return read


def _client_ranged(urls: list[str], total: int) -> Callable[[], int]:
    """The client fetching the objects in the ranges our reader asks for (CHUNK_SIZE), all at once."""
    fs, _ = filesystems.filesystem(urls[0])
    paths, starts, ends = [], [], []
    for url in urls:
        size = fs.size(url)
        for start in range(0, size, CHUNK_SIZE):
            paths.append(fs._strip_protocol(url))
            starts.append(start)
            ends.append(min(start + CHUNK_SIZE, size))

    def read() -> int:
        return sum(map(len, fs.cat_ranges(paths, starts, ends)))

    return read


def measure_tfrecord(store: Store) -> dict[str, str]:
    settings = store.settings
    local, urls, total = write_tfrecords(store)
    mb = total / 1e6
    if _records_digest(urls, settings.batch_size) != _records_digest(local, settings.batch_size):
        print("FAILED: the records read from the store differ from the local ones", file=sys.stderr)
        raise SystemExit(1)
    batch, cycle, name, client = settings.batch_size, settings.files, store.protocol, store.client
    readers = {
        "local": _count(local, batch_size=batch),
        name: _count(urls, batch_size=batch),
        f"{client}_get": _client_get(urls),
        f"{client}_ranged": _client_ranged(urls, total),
        "interleaved_local": _count(local, batch_size=batch, interleave_cycle_length=cycle),
        f"interleaved_{name}": _count(urls, batch_size=batch, interleave_cycle_length=cycle),
        "parsed_local": _parsed(local, batch),
        f"parsed_{name}": _parsed(urls, batch),
    }
    with contextlib.ExitStack() as stack:
        tensorflow, how = tensorflow_readers(store, stack, urls, local)
        readers.update(tensorflow)
        seconds = run_rounds(settings, readers)
    print(
        f"tfrecord ({name}): {mb:.1f} MB in {settings.files} files from {store.endpoint}, batch {batch}, "
        f"{settings.rounds} rounds (median):"
    )
    for reader, values in seconds.items():
        median = statistics.median(values)
        print(f"  {reader:<18} {median:7.3f} s  {mb / median:8.1f} MB/s")
    print(f"  {how}")
    figures = {
        "tfrecord_vs_local": ratio(seconds, name, "local"),
        f"tfrecord_vs_{client}_get": ratio(seconds, name, f"{client}_get"),
        f"tfrecord_vs_{client}_ranged": ratio(seconds, name, f"{client}_ranged"),
        "tfrecord_vs_tfdata": ratio(seconds, name, "tfdata") if tensorflow else None,
        "interleaved_vs_local": ratio(seconds, f"interleaved_{name}", "interleaved_local"),
        "parsed_vs_local": ratio(seconds, f"parsed_{name}", "parsed_local"),
        f"{client}_get_vs_local": ratio(seconds, f"{client}_get", "local"),
    }
    if "proxied_get" in seconds:
        print(
            f"  tfdata_vs_proxied_get={ratio(seconds, 'tfdata', 'proxied_get'):.3f} (tf.data's share of the floor "
            f"of its path) proxied_get_vs_{client}_get={ratio(seconds, 'proxied_get', f'{client}_get'):.3f} "
            f"(what the proxy costs that floor)"
        )
    floor = figures[f"{client}_get_vs_local"]
    if floor < TARGETS["tfrecord_vs_local"]:
        print(
            f"  measured floor: {client}'s plain get from this server reaches {floor:.3f}x the local read, below "
            f"the {TARGETS['tfrecord_vs_local']}x target: no reader of this server can meet it; "
            f"tfrecord_vs_{client}_get={figures[f'tfrecord_vs_{client}_get']:.3f} is the reader's share of that "
            "floor"
        )
    return {key: "n/a" if value is None else f"{value:.3f}" for key, value in figures.items()}


# --------------------------------------------------------------------------- checkpoints


def _checkpoint_state(mb: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """Model tensors of ``mb`` MB and an optimizer state as big again (Adam keeps two moments: one here)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    count = max(1, int(mb * 1e6 / 4 / 4))
    model = {f"layer{index}.weight": torch.randn(count, generator=generator) for index in range(4)}
    optimizer = {
        "optimizer": {
            "state": {index: {"exp_avg": torch.randn(count, generator=generator)} for index in range(4)},
            "param_groups": [{"lr": 0.001, "params": [0, 1, 2, 3]}],
        }
    }
    return model, optimizer


class _CountedLists:
    """Counts the listing requests a filesystem issues (ls, find, glob, info of a prefix) while installed."""

    def __init__(self, fs: Any) -> None:
        self.fs, self.calls, self.saved = fs, 0, {}

    def __enter__(self) -> _CountedLists:
        for name in ("ls", "find", "glob", "_ls", "_find", "_glob", "_lsdir"):
            method = getattr(self.fs, name, None)
            if method is None:
                continue
            self.saved[name] = method

            def counted(*args: Any, __method: Callable[..., Any] = method, **kwargs: Any) -> Any:
                self.calls += 1
                return __method(*args, **kwargs)

            setattr(self.fs, name, counted)
        return self

    def __exit__(self, *exc: Any) -> None:
        for name in self.saved:
            delattr(self.fs, name)  # the instance attribute goes: the class's method is back


def measure_checkpoint(store: Store) -> dict[str, str]:
    """Saves and restores through CheckpointStore on local disk and on the server; the client's plain put/get of
    the same files as the server's floor; LIST requests per save with many checkpoints kept."""
    import torch

    from torchestimator.checkpoint import CheckpointStore

    settings = store.settings
    name, client = store.protocol, store.client
    model, optimizer = _checkpoint_state(settings.checkpoint_mb)
    local = CheckpointStore(os.path.join(store.local_dir, "ckpt-bench"), keep_checkpoint_max=2)
    remote = CheckpointStore(f"{store.bucket_url}/ckpt-bench", keep_checkpoint_max=2)
    fs, _ = filesystems.filesystem(store.bucket_url)
    step = iter(range(1, 10**6))
    files: list[str] = []

    def save(where: CheckpointStore) -> Callable[[], int]:
        def run() -> int:
            path = where.save(next(step), model, optimizer, {"position": 1})
            files[:] = [f"{path}/{name}" for name in filesystems.listdir(path)] if where is remote else files
            return 0

        return run

    def restore(where: CheckpointStore) -> Callable[[], int]:
        return lambda: len(where.restore().model_state)

    save(remote)()  # the files the client's plain put and get move
    blobs = {url: filesystems.read_bytes(url) for url in files}
    total = sum(len(blob) for blob in blobs.values())
    plain = f"{store.bucket_url}/plain"

    def plain_put() -> int:
        fs.pipe({f"{plain}/{url.rsplit('/', 1)[1]}": blob for url, blob in blobs.items()})
        return 0

    def plain_get() -> int:
        return len(fs.cat([f"{plain}/{url.rsplit('/', 1)[1]}" for url in blobs]))

    plain_put()
    seconds = run_rounds(
        settings,
        {
            "save_local": save(local),
            f"save_{name}": save(remote),
            f"put_{client}": plain_put,
            "load_local": restore(local),
            f"load_{name}": restore(remote),
            f"get_{client}": plain_get,
        },
    )
    restored = remote.restore()
    if not all(torch.equal(restored.model_state[key], tensor) for key, tensor in model.items()):
        print("FAILED: the checkpoint restored from the store differs from the one saved", file=sys.stderr)
        raise SystemExit(1)
    # Listing requests per save, steady state, with 50 checkpoints kept (a save must not list each of them).
    many = CheckpointStore(f"{store.bucket_url}/many", keep_checkpoint_max=None)
    small = {"w": torch.zeros(4)}
    for index in range(50):
        many.save(index + 1, small)
    with _CountedLists(fs) as counted:
        for index in range(10):
            many.save(100 + index, small)
    print(f"checkpoint ({name}): {total / 1e6:.1f} MB in {len(blobs)} files, {settings.rounds} rounds (median):")
    for reader, values in seconds.items():
        median = statistics.median(values)
        print(f"  {reader:<12} {median:7.3f} s  {total / 1e6 / median:8.1f} MB/s")
    figures = {
        "ckpt_save_vs_local": ratio(seconds, f"save_{name}", "save_local"),
        "ckpt_load_vs_local": ratio(seconds, f"load_{name}", "load_local"),
        f"ckpt_save_vs_{client}_put": ratio(seconds, f"save_{name}", f"put_{client}"),
        f"ckpt_load_vs_{client}_get": ratio(seconds, f"load_{name}", f"get_{client}"),
        "upload_gbps": total * 8 / 1e9 / statistics.median(seconds[f"save_{name}"]),
        "list_calls_per_save": counted.calls / 10,
    }
    return {key: f"{value:.3f}" if key != "list_calls_per_save" else f"{value:g}" for key, value in figures.items()}


MEASUREMENTS: tuple[Callable[[Store], dict[str, str]], ...] = (measure_tfrecord, measure_checkpoint)
"""One function per measurement, each returning its key=value pairs for the last line (in this order)."""


def main(argv: list[str] | None = None) -> int:
    settings = parse_settings(argv)
    lines: list[str] = []
    started = time.perf_counter()
    for protocol in settings.stores:
        figures: dict[str, str] = {}
        with open_store(settings, protocol) as store:
            for measure in MEASUREMENTS:
                figures.update(measure(store))
        lines.append(f"object_storage store={protocol} " + " ".join(f"{key}={value}" for key, value in figures.items()))
    print(f"total: {time.perf_counter() - started:.1f} s")
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-tls-proxy"]:
        serve_tls_proxy(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    sys.exit(main())
