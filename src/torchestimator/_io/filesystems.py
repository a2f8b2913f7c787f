"""Paths that may be URLs: one place that knows whether a path is on this machine or in an object store.

Belongs here: telling a URL (``s3://b/run``, ``gs://``, ``az://``/``abfs://``, ``memory://``) from a local
path (``file://`` URLs are local paths); the fsspec filesystem behind a URL, made once per protocol and
options, with the backend's extra named when it is missing; the storage options a program configures
(``RunConfig(storage_options=...)``); and the few file operations the package does on a path of either
kind (join, exists, list, glob, read, write whole, open), each failure naming the URL. A local path
goes straight to ``os`` and ``open``, as before this module existed: no fsspec on that path.

Does not belong here: the crash-safe commit of a checkpoint or an export on a store that cannot rename
(``checkpoint/object_storage.py``), reading records (``data/``), polling for versions (``serving/``).

Credentials and endpoints are the backends' own: s3fs reads ``AWS_ENDPOINT_URL``, the ``AWS_*`` keys
and profiles; gcsfs ``STORAGE_EMULATOR_HOST`` and ``GOOGLE_APPLICATION_CREDENTIALS``; adlfs
``AZURE_STORAGE_CONNECTION_STRING`` and the account variables. Options given here are passed to the
filesystem as keyword arguments and never appear in a message or a log line (they may hold secrets).

Transfers that cannot hang: each filesystem gets timeouts and retries unless the options set them
(``transfer_defaults``). A request that sends or receives no byte for ``read_timeout`` seconds, or cannot
connect in ``connect_timeout``, fails; throttling (503 SlowDown), 500s, resets and timeouts are retried with
exponential backoff and jitter; what still fails is an OSError naming the URL (a ``TimeoutError`` saying
"stalled" for a timeout). The keys, per backend (defaults in brackets):

- s3 (s3fs): ``config_kwargs={"connect_timeout": 10, "read_timeout": 60, "retries": {"total_max_attempts": 4,
  "mode": "standard"}}`` (botocore's, the first attempt counted; give any of them, the others keep their
  default), and ``retries`` [2]: s3fs's own rounds around botocore's (they also retry a download whose body
  was cut short). Sends have a deadline too (``http_session_cls``, see ``_s3_session_with_send_deadline``).
  ``max_concurrency`` [10]: s3fs's requests at once for one file (ranged reads, ``put``); checkpoint
  uploads send at most ``TORCHESTIMATOR_UPLOAD_PARTS_IN_FLIGHT`` [4] of them (``checkpoint/object_storage.py``).
- gs (gcsfs): ``requests_timeout`` [``aiohttp.ClientTimeout(sock_connect=10, sock_read=60)``; a number is
  a total per request], ``retries`` [gcsfs's 6 tries per request, with its backoff: 1, 2, 4, 8, 16 s plus up to
  1 s of jitter; 500-504, 408, 429, resets, timeouts and bodies cut short are retried].
- az (adlfs): ``connection_timeout`` [10], ``read_timeout`` [60], now on every request (adlfs passes them to
  whole-blob calls only; ``transfers.fit_azure_client`` gives it a client whose transport has them), and the
  Azure SDK's retry policy, whose arguments storage_options may give: ``retry_total`` [3 retries, so 4 tries],
  ``initial_backoff`` [15 s], ``increment_base`` [3: waits of 15, 18, 24 s], ``random_jitter_range`` [3 s], or a
  whole ``retry_policy``; 408, 500s but 501/505, resets and timeouts are retried.

Sends have a deadline on every store: aiohttp (gcsfs, Azure) and aiobotocore time a request out only once its
body is sent, so a server that stops reading mid-body held the upload forever. On S3 see
``_s3_session_with_send_deadline``; on gs:// and az:// each request is ``transfers.request_class_with_send_deadline``,
which ends a body that no byte of reaches the socket for ``read_timeout`` seconds with a retried timeout.

The deadline of a stalled transfer: a request that never answers (or stops reading what is sent) costs
``read_timeout`` per try, so it fails after at most the tries times ``read_timeout`` plus backoff: on S3
``retries * total_max_attempts * read_timeout`` (8 minutes by default; ``{"config_kwargs": {"read_timeout": 5,
"retries": {"total_max_attempts": 2}}, "retries": 1}`` makes it 10 s and a few seconds of backoff); on gs://
``retries * read_timeout`` plus 31 to 36 s of backoff (about 7 minutes by default; ``{"retries": 2,
"requests_timeout": aiohttp.ClientTimeout(sock_connect=5, sock_read=5)}``: 10 s and 1 to 2 s of backoff); on
az:// ``(retry_total + 1) * read_timeout`` plus backoff (about 5 minutes by default; ``{"read_timeout": 5,
"retry_total": 1, "initial_backoff": 1}``: 10 s and about 1 s of backoff).
A transfer that makes progress is never cut: there is no limit on a whole upload's time, which grows with
its size.
"""

from __future__ import annotations

import errno
import fnmatch
import functools
import glob as local_glob
import os
import posixpath
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO, TypeVar

from torchestimator._extras import import_extra
from torchestimator.errors import ConfigError

__all__ = [
    "PROTOCOL_EXTRAS",
    "checked_storage_options",
    "configure_storage_options",
    "exists",
    "filesystem",
    "glob",
    "is_dir",
    "is_url",
    "join",
    "listdir",
    "local_path",
    "makedirs",
    "open_for_reading",
    "parent",
    "protocol_of",
    "read_bytes",
    "remove",
    "remove_tree",
    "storage_options_for",
    "transfer_defaults",
    "write_bytes",
]

CONNECT_TIMEOUT_SECONDS = 10
READ_TIMEOUT_SECONDS = 60
S3_MAX_ATTEMPTS = 4
"""botocore's attempts per request, the first included (its ``total_max_attempts``; its ``max_attempts`` counts
retries only); standard mode: exponential backoff with jitter, up to 20 s a wait."""
S3FS_RETRIES = 2
"""s3fs's rounds around botocore's attempts (its default, 5, made a stalled request cost 25 read timeouts)."""

PROTOCOL_EXTRAS: dict[str, tuple[str | None, str | None]] = {
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
    "az": ("adlfs", "azure"),
    "abfs": ("adlfs", "azure"),
    "abfss": ("adlfs", "azure"),
    "memory": (None, None),
}
"""The URL schemes we take, and (module, extra) of their backend; None: fsspec's own, always installed."""

_CANONICAL = {"s3a": "s3", "gcs": "gs", "abfs": "az", "abfss": "az"}
"""Schemes that name the same store (fsspec registers them all); options given for one apply to the others."""

_lock = threading.Lock()
_T = TypeVar("_T")
_configured: dict[str, dict[str, Any]] = {}
_filesystems: dict[tuple[int, str, str], Any] = {}


def protocol_of(path: str | os.PathLike[str]) -> str | None:
    """The scheme of a URL we take (``"s3"``), ``None`` for a local path or ``file://`` URL.

    A scheme we do not know (``hdfs://``) is a ConfigError, not a local folder named ``hdfs:``.
    """
    text = os.fspath(path)
    if not isinstance(text, str) or "://" not in text:
        return None
    scheme = text.split("://", 1)[0].lower()
    if scheme == "file":
        return None
    if scheme not in PROTOCOL_EXTRAS:
        raise ConfigError(
            f"{text}: torchestimator reads and writes local paths and the URL schemes "
            f"{', '.join(s + '://' for s in sorted(PROTOCOL_EXTRAS))}; not {scheme}://.",
            field="path",
            value=text,
        )
    return scheme


def is_url(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names an object in a store (not a local file, which ``file://`` URLs are)."""
    return protocol_of(path) is not None


def local_path(path: str | os.PathLike[str]) -> str:
    """A local path as ``os`` takes it: ``file:///a/b`` becomes ``/a/b``; other local paths are unchanged."""
    text = os.fspath(path)
    if isinstance(text, str) and text[:7].lower() == "file://":
        return text[7:]
    return text


def join(base: str | os.PathLike[str], *parts: str) -> str:
    """``os.path.join`` for local paths; for a URL, joined with ``/`` whatever this machine's separator."""
    text = os.fspath(base)
    if is_url(text):
        return posixpath.join(text, *parts)
    return os.path.join(text, *parts)


def parent(path: str | os.PathLike[str]) -> str:
    """The folder holding ``path``: ``os.path.dirname`` for local paths; for a URL, up to its last ``/``."""
    text = os.fspath(path)
    if is_url(text):
        return text.rstrip("/").rsplit("/", 1)[0]
    return os.path.dirname(text)


def configure_storage_options(options: Mapping[str, Any] | None) -> None:
    """Set the options every filesystem this process makes from now on gets (``RunConfig(storage_options=...)``).

    ``options`` is either one mapping for every store (``{"endpoint_url": ...}``) or one per scheme
    (``{"s3": {...}, "gs": {...}}``). Filesystems made with the previous options are dropped.
    """
    per_protocol = _options_per_protocol(options)
    with _lock:
        _configured.clear()
        _configured.update(per_protocol)
        _filesystems.clear()


def checked_storage_options(options: Mapping[str, Any]) -> None:
    """Raises the ConfigError ``configure_storage_options`` would, without configuring anything."""
    _options_per_protocol(options)


def storage_options_for(protocol: str) -> dict[str, Any]:
    """The configured options of ``protocol`` (a copy; empty when none were given)."""
    with _lock:
        return dict(_configured.get(_CANONICAL.get(protocol, protocol), {}))


def _options_per_protocol(options: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ConfigError(
            f"storage_options must be a dict (of filesystem arguments, or of those per URL scheme); "
            f"received a {type(options).__name__}.",
            field="storage_options",
            value=type(options).__name__,
        )
    schemes = [key for key in options if key in PROTOCOL_EXTRAS]
    if not schemes:
        return {"*": dict(options)}
    if len(schemes) != len(options):
        others = sorted(set(options) - set(schemes))
        raise ConfigError(
            f"storage_options mixes URL schemes ({', '.join(schemes)}) with filesystem arguments "
            f"({', '.join(others)}): give either one dict for every store or one per scheme, "
            "as {'s3': {...}, 'gs': {...}}.",
            field="storage_options",
            value=sorted(options),
        )
    per_protocol: dict[str, dict[str, Any]] = {}
    for scheme, value in options.items():
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"storage_options[{scheme!r}] must be a dict of filesystem arguments; received a "
                f"{type(value).__name__}.",
                field=f"storage_options.{scheme}",
                value=type(value).__name__,
            )
        per_protocol[_CANONICAL.get(scheme, scheme)] = dict(value)
    return per_protocol


def filesystem(path: str | os.PathLike[str]) -> tuple[Any, str]:
    """The fsspec filesystem behind a URL and the path it takes (``bucket/key``: no scheme).

    One filesystem per scheme and options in the process (fsspec's own instance cache is per arguments
    too, but its async filesystems hold a loop: one instance keeps one connection pool). A missing
    backend is a MissingExtraError naming the extra.
    """
    text = os.fspath(path)
    protocol = protocol_of(text)
    if protocol is None:
        raise ValueError(f"{text} is a local path, not a URL.")
    module, extra = PROTOCOL_EXTRAS[protocol]
    if module is not None and extra is not None:  # both or neither
        import_extra(module, extra=extra, feature=f"a {protocol}:// path ({text})")
    canonical = _CANONICAL.get(protocol, protocol)
    with _lock:
        options = dict(_configured.get(canonical, _configured.get("*", {})))
        # The pid too: an async filesystem holds an event loop and connections that a forked child (a DataLoader
        # worker) must not share; fsspec makes the child its own instance.
        key = (os.getpid(), canonical, repr(sorted(options.items(), key=lambda item: item[0])))
        instance = _filesystems.get(key)
        if instance is None:
            import fsspec

            arguments, settings = transfer_defaults(canonical, options)
            if canonical in ("gs", "az"):
                # Ours alone: fsspec's cache would hand the same instance to options that differ only in the
                # settings applied below (not arguments), and a setting applied for one would change the other.
                arguments["skip_instance_cache"] = True
            instance = fsspec.filesystem(protocol, **arguments)
            _apply_settings(canonical, instance, settings)
            _filesystems[key] = instance
    return instance, instance._strip_protocol(text)


def transfer_defaults(protocol: str, options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The filesystem arguments of ``options`` with our timeouts and retries where they set none, and the
    settings to apply to the instance once made (``_apply_settings``: s3fs's and gcsfs's ``retries``, adlfs's
    client timeouts and retry policy), which are not arguments of theirs.

    The user's values win, key by key (``config_kwargs={"read_timeout": 5}`` keeps our connect timeout).
    """
    arguments = dict(options)
    settings: dict[str, Any] = {}
    if protocol == "s3":
        config = dict(arguments.get("config_kwargs") or {})
        config.setdefault("connect_timeout", CONNECT_TIMEOUT_SECONDS)
        config.setdefault("read_timeout", READ_TIMEOUT_SECONDS)
        config.setdefault("retries", {"total_max_attempts": S3_MAX_ATTEMPTS, "mode": "standard"})
        session = _s3_session_with_send_deadline()
        if session is not None:
            config.setdefault("http_session_cls", session)
        arguments["config_kwargs"] = config
        settings["retries"] = _at_least_one(arguments.pop("retries", S3FS_RETRIES), "retries")
    elif protocol == "gs":
        if "requests_timeout" not in arguments:
            import aiohttp

            arguments["requests_timeout"] = aiohttp.ClientTimeout(
                sock_connect=CONNECT_TIMEOUT_SECONDS, sock_read=READ_TIMEOUT_SECONDS
            )
        from torchestimator._io.transfers import request_class_with_send_deadline

        session_kwargs = dict(arguments.get("session_kwargs") or {})
        session_kwargs.setdefault("request_class", request_class_with_send_deadline())
        arguments["session_kwargs"] = session_kwargs
        if "retries" in arguments:
            settings["retries"] = _at_least_one(arguments.pop("retries"), "retries")
    elif protocol == "az":
        arguments.setdefault("connection_timeout", CONNECT_TIMEOUT_SECONDS)
        arguments.setdefault("read_timeout", READ_TIMEOUT_SECONDS)
        settings["connection_timeout"] = arguments["connection_timeout"]
        settings["read_timeout"] = arguments["read_timeout"]
        for name in AZURE_RETRY_OPTIONS:
            if name in arguments:
                settings[name] = arguments.pop(name)
        if "retry_total" in settings and int(settings["retry_total"]) < 0:
            raise ConfigError(
                f"storage_options 'retry_total' (retries after the first try) must be at least 0; "
                f"received {settings['retry_total']}.",
                field="storage_options.retry_total",
                value=settings["retry_total"],
            )
    return arguments, settings


AZURE_RETRY_OPTIONS = (
    "retry_policy",
    "retry_total",
    "retry_connect",
    "retry_read",
    "retry_status",
    "initial_backoff",
    "increment_base",
    "random_jitter_range",
)
"""The Azure SDK's retry settings (``azure.storage.blob.ExponentialRetry``'s arguments, or a whole policy) that
storage_options may give for az://; adlfs takes none of them, so they go to the client ``_apply_settings`` makes."""


def _at_least_one(value: Any, name: str) -> int:
    number = int(value)
    if number < 1:
        raise ConfigError(
            f"storage_options {name!r} must be at least 1 (one attempt); received {value}.",
            field=f"storage_options.{name}",
            value=value,
        )
    return number


def _apply_settings(protocol: str, instance: Any, settings: Mapping[str, Any]) -> None:
    """What ``transfer_defaults`` could not pass as arguments, set on a filesystem just made."""
    if protocol == "s3":
        instance.retries = settings["retries"]
    elif protocol == "gs" and "retries" in settings:
        from torchestimator._io.transfers import set_gcs_retries

        if not set_gcs_retries(instance, settings["retries"]):
            raise ConfigError(
                "storage_options 'retries' for gs:// cannot be applied: this gcsfs version's retrying "
                "methods are not the ones torchestimator knows; leave it out (gcsfs then tries each "
                "request 6 times).",
                field="storage_options.retries",
                value=settings["retries"],
            )
    elif protocol == "az":
        from torchestimator._io.transfers import fit_azure_client

        fit_azure_client(instance, **settings)


_SEND_SLICE_BYTES = 256 * 1024


@functools.cache
def _s3_session_with_send_deadline() -> type | None:
    """aiobotocore's HTTP session, with a deadline on sending a request as aiohttp has on reading its answer.

    aiohttp's ``sock_read`` timeout starts once the body is sent; until then nothing times out: a server
    that never answers ``Expect: 100-continue`` (botocore asks it on every PUT) or stops reading mid-body
    held the upload forever. Here the header is not sent (it is not signed; the body goes at once), and
    the body is handed to aiohttp in slices: no slice taken for ``read_timeout`` seconds ends the attempt
    with botocore's ReadTimeoutError, which its retries and s3fs's take as any other timeout.
    """
    import asyncio
    import inspect

    from aiobotocore.config import AioConfig
    from aiobotocore.httpsession import AIOHTTPSession
    from botocore.exceptions import ReadTimeoutError

    if "http_session_cls" not in inspect.signature(AioConfig.__init__).parameters:
        return None  # aiobotocore before 2.13 takes no session class: sends wait as aiohttp lets them

    class SessionWithSendDeadline(AIOHTTPSession):
        async def send(self, request):
            request.headers.pop("Expect", None)
            body = request.body
            pieces: Iterator[Any]
            if isinstance(body, (bytes, bytearray, memoryview)):
                view = memoryview(body).cast("B")
                pieces = (view[start : start + _SEND_SLICE_BYTES] for start in range(0, view.nbytes, _SEND_SLICE_BYTES))
            elif hasattr(body, "read") and "Content-Length" in request.headers:  # botocore's BytesIO, a file
                pieces = iter(lambda: body.read(_SEND_SLICE_BYTES), b"")
            else:
                return await super().send(request)
            stall_seconds = self._timeout.sock_read or READ_TIMEOUT_SECONDS
            loop = asyncio.get_running_loop()
            progress = {"at": loop.time(), "done": False}

            async def slices():
                for piece in pieces:
                    progress["at"] = loop.time()
                    yield piece
                progress["done"] = True  # from here on aiohttp's read timeout watches the answer

            request.body = slices()
            sending = asyncio.ensure_future(super().send(request))
            try:
                while True:
                    idle = loop.time() - progress["at"]
                    await asyncio.wait({sending}, timeout=max(0.05, stall_seconds - idle))
                    if sending.done():
                        return sending.result()
                    if not progress["done"] and loop.time() - progress["at"] >= stall_seconds:
                        sending.cancel()
                        raise ReadTimeoutError(
                            endpoint_url=request.url,
                            error=f"no byte of the request body could be sent for {stall_seconds:g} s",
                        )
            finally:
                if not sending.done():
                    sending.cancel()
                request.body = body  # botocore retries with the same request

    return SessionWithSendDeadline


def _named(error: BaseException, url: str, doing: str) -> OSError:
    """An OSError that names the URL and what was being done; its errno kept, so callers can branch on it."""
    if isinstance(error, FileNotFoundError):
        return FileNotFoundError(errno.ENOENT, f"{doing} {url}: no such object or bucket ({_cause(error)})", url)
    if isinstance(error, PermissionError):
        return PermissionError(
            errno.EACCES,
            f"{doing} {url}: permission denied ({_cause(error)}); check the credentials and the bucket's access rules",
            url,
        )
    if _is_timeout(error):
        return TimeoutError(
            errno.ETIMEDOUT,
            f"{doing} {url} timed out: the store stalled (no data within the read "
            f"or connect timeout, on every retry: {_cause(error)}); check the network and the "
            "endpoint, or raise read_timeout in storage_options",
            url,
        )
    if _is_unreachable(error):
        return ConnectionError(
            errno.ECONNREFUSED,
            f"{doing} {url} failed: the store cannot be reached ({_cause(error)}); check the endpoint and the network",
            url,
        )
    code = getattr(error, "errno", None) or errno.EIO
    return OSError(code, f"{doing} {url} failed: {_cause(error)}", url)


def _chain(error: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _is_timeout(error: BaseException) -> bool:
    """socket, asyncio and fsspec timeouts are TimeoutErrors; botocore's and aiohttp's are named so."""
    return any(isinstance(link, TimeoutError) or "Timeout" in type(link).__name__ for link in _chain(error))


def _is_unreachable(error: BaseException) -> bool:
    """Refused or unresolvable endpoints: botocore's EndpointConnectionError, aiohttp's ClientConnectorError."""
    return any(
        isinstance(link, ConnectionRefusedError)
        or type(link).__name__ in ("EndpointConnectionError", "ClientConnectorError")
        for link in _chain(error)
    )


def _cause(error: BaseException) -> str:
    """The error's message, or, where it has none (fsspec's FSTimeoutError), the first one down its chain."""
    text = ""
    for link in _chain(error):
        strerror = getattr(link, "strerror", None)  # an OSError's message without "[Errno N]" and its filename
        message = strerror if isinstance(strerror, str) and strerror else str(link)
        text = " ".join(message.split())
        if text:
            break
    text = text or type(error).__name__
    return text if len(text) <= 300 else text[:300] + "..."


def _store_call(url: str, doing: str, call: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    try:
        return call(*args, **kwargs)
    except (OSError, ValueError, RuntimeError) as error:  # botocore and aiohttp errors are among these
        raise _named(error, url, doing) from error
    except Exception as error:  # a backend's own error type (google.auth, azure.core): still named
        raise _named(error, url, doing) from error


def exists(path: str | os.PathLike[str]) -> bool:
    """Whether a file or folder (for a store: an object, or a prefix with objects under it) is there."""
    if not is_url(path):
        return os.path.exists(local_path(path))
    fs, inner = filesystem(path)
    fs.invalidate_cache(inner)  # s3fs and gcsfs answer from listings they cached: another process may have written
    return bool(_store_call(os.fspath(path), "looking for", fs.exists, inner))


def is_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a folder (for a store: a prefix with objects under it, or a bucket)."""
    if not is_url(path):
        return os.path.isdir(local_path(path))
    fs, inner = filesystem(path)
    fs.invalidate_cache(inner)
    return bool(_store_call(os.fspath(path), "looking at", fs.isdir, inner))


def listdir(path: str | os.PathLike[str]) -> list[str]:
    """The names (not paths) in a folder; FileNotFoundError naming it when there is none."""
    if not is_url(path):
        return os.listdir(local_path(path))
    url = os.fspath(path)
    fs, inner = filesystem(url)
    fs.invalidate_cache(inner)  # adlfs ignores refresh=; every fsspec store honours this
    entries = _store_call(url, "listing", fs.ls, inner, detail=False, refresh=True)
    names = sorted({posixpath.basename(entry.rstrip("/")) for entry in entries})
    return [name for name in names if name]


def glob(pattern: str | os.PathLike[str]) -> list[str]:
    """Paths matching a glob pattern, sorted; for a URL, full URLs with the pattern's own scheme."""
    text = os.fspath(pattern)
    if not is_url(text):
        return sorted(local_glob.glob(local_path(text)))
    scheme = text.split("://", 1)[0]
    fs, inner = filesystem(text)
    if not any(character in inner for character in "*?["):
        return [text] if _store_call(text, "looking for", fs.isfile, inner) else []
    matches = _store_call(text, "listing", fs.glob, inner)
    # memory:// paths come back rooted ("/bucket/key"): one "/" after the scheme's "//", as the pattern had it.
    return sorted(
        f"{scheme}://{match.lstrip('/')}"
        for match in matches
        if fnmatch.fnmatchcase(match, inner) or fnmatch.fnmatchcase(match.lstrip("/"), inner.lstrip("/"))
    )


def makedirs(path: str | os.PathLike[str]) -> None:
    """Create a folder and its parents; on a store there are no folders (a prefix exists with its objects)."""
    if not is_url(path):
        os.makedirs(local_path(path), exist_ok=True)


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """The whole file; FileNotFoundError/PermissionError/OSError naming the path."""
    if not is_url(path):
        with open(local_path(path), "rb") as handle:
            return handle.read()
    url = os.fspath(path)
    fs, inner = filesystem(url)
    return _store_call(url, "reading", fs.cat_file, inner)


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write a whole file so that readers see the old content or the new, never a part.

    Local: ``atomic.write_bytes_atomically`` (temporary file, fsync, rename). A store: one PUT, which
    object stores apply whole (an object is never seen half-written), with the backend's retries.
    """
    if not is_url(path):
        from torchestimator._io.atomic import write_bytes_atomically

        write_bytes_atomically(local_path(path), data)
        return
    url = os.fspath(path)
    fs, inner = filesystem(url)
    _store_call(url, "writing", fs.pipe_file, inner, bytes(data))


def open_for_reading(path: str | os.PathLike[str]) -> BinaryIO:
    """A binary stream (``read``, ``readinto``, ``seek``); for a URL, fsspec's buffered, ranged reader."""
    if not is_url(path):
        return open(local_path(path), "rb")
    url = os.fspath(path)
    fs, inner = filesystem(url)
    return _store_call(url, "opening", fs.open, inner, "rb")


def remove(path: str | os.PathLike[str]) -> None:
    """Remove one file; a missing one is not an error."""
    if not is_url(path):
        try:
            os.remove(local_path(path))
        except FileNotFoundError:
            pass
        return
    url = os.fspath(path)
    fs, inner = filesystem(url)
    try:
        fs.rm_file(inner)
    except FileNotFoundError:
        pass
    except Exception as error:
        raise _named(error, url, "removing") from error


def remove_tree(path: str | os.PathLike[str]) -> None:
    """Remove a folder and everything under it; a missing one is not an error."""
    if not is_url(path):
        import shutil

        if os.path.isdir(local_path(path)):
            shutil.rmtree(local_path(path))
        return
    url = os.fspath(path)
    fs, inner = filesystem(url)
    try:
        fs.rm(inner.rstrip("/") + "/", recursive=True)
    except FileNotFoundError:
        pass
    except Exception as error:
        raise _named(error, url, "removing") from error
