"""What ``filesystems.transfer_defaults`` cannot say as a filesystem argument: the deadline of a request's body
on gs:// and az://, gcsfs's number of tries, and the Azure SDK's timeouts and retries for every request.

Belongs here: the aiohttp request class that bounds sending a body (gcsfs and the Azure SDK both send through
aiohttp), re-arming gcsfs's retry decorator with another count, and giving an adlfs filesystem a blob service
client built with our transport and retry policy. Does not belong here: which defaults apply
(``filesystems.transfer_defaults``), naming the URL in errors (``filesystems._named``), S3's send deadline
(``filesystems._s3_session_with_send_deadline``: botocore's session, not aiohttp's request).
"""

from __future__ import annotations

import asyncio
import functools
import types
from typing import Any

_CHECKS_PER_DEADLINE = 4
"""How often, per stall deadline, a send in progress is looked at: a stall is seen at most a quarter late."""


@functools.cache
def request_class_with_send_deadline() -> type:
    """aiohttp's ``ClientRequest``, with a deadline on sending the body as ``sock_read`` has on the answer.

    aiohttp starts its ``sock_read`` timer once the body is sent: until then nothing times out, so a server
    that stops reading a body mid-way (or one too big for the socket buffers, never read) holds the request
    forever. Here no byte of the body reaching the socket for ``sock_read`` seconds ends the attempt with
    aiohttp's ``ServerTimeoutError``, which gcsfs and the Azure SDK retry as any other timeout; the connection
    is dropped (a half-sent body is never committed: the server sees fewer bytes than Content-Length).
    A request without ``sock_read`` (a total timeout instead) is sent as aiohttp sends it.
    """
    import aiohttp

    class RequestWithSendDeadline(aiohttp.ClientRequest):
        async def write_bytes(self, writer: Any, conn: Any, *args: Any, **kwargs: Any) -> None:
            protocol, transport = conn.protocol, conn.transport
            stall_seconds = getattr(protocol, "read_timeout", getattr(protocol, "_read_timeout", None))
            if not stall_seconds or transport is None or not hasattr(writer, "output_size"):
                return await super().write_bytes(writer, conn, *args, **kwargs)

            def sent() -> int:  # bytes the kernel took: handed to the transport, less what it still holds
                return writer.output_size - transport.get_write_buffer_size()

            loop = asyncio.get_running_loop()
            sending = asyncio.ensure_future(super().write_bytes(writer, conn, *args, **kwargs))
            sending.add_done_callback(lambda task: task.cancelled() or task.exception())
            progress, progress_at = sent(), loop.time()
            try:
                while True:
                    await asyncio.wait({sending}, timeout=stall_seconds / _CHECKS_PER_DEADLINE)
                    if sending.done():
                        return sending.result()
                    now = sent()
                    if now != progress:
                        progress, progress_at = now, loop.time()
                    elif loop.time() - progress_at >= stall_seconds:
                        # The answer's reader gets this error; the URL is not in it (it may carry a SAS token).
                        protocol.set_exception(
                            aiohttp.ServerTimeoutError(
                                f"no byte of the request body could be sent for {stall_seconds:g} s"
                            )
                        )
                        transport.abort()
                        return None
            finally:
                if not sending.done():
                    sending.cancel()

    return RequestWithSendDeadline


# ---------------------------------------------------------------------------- gcsfs


_GCS_RETRYING_METHODS = ("_request", "_get_file_request", "_get_file_concurrent")
"""gcsfs's methods under ``@retry_request(retries=6)``: the count is fixed when the class is made."""


def set_gcs_retries(fs: Any, retries: int) -> bool:
    """Make ``fs`` (a GCSFileSystem) try each request ``retries`` times, with gcsfs's backoff (1, 2, 4... s, plus
    up to 1 s of jitter, at most 32 s). False where this gcsfs has no decorated method to re-arm."""
    from gcsfs.retry import retry_request

    rearmed = False
    for name in _GCS_RETRYING_METHODS:
        raw = getattr(getattr(type(fs), name, None), "__wrapped__", None)
        if raw is not None:
            setattr(fs, name, types.MethodType(retry_request(retries=retries)(raw), fs))
            rearmed = True
    fs.retries = retries
    return rearmed


# ---------------------------------------------------------------------------- adlfs


def fit_azure_client(fs: Any, *, connection_timeout: float, read_timeout: float, **retry: Any) -> None:
    """Give ``fs`` (an AzureBlobFileSystem) a blob service client with the same account, endpoint and credential,
    whose every request has these timeouts and the send deadline, and whose retry policy takes ``retry``
    (``retry_total``, ``initial_backoff``, ``increment_base``, ``random_jitter_range``, or a ``retry_policy``).

    adlfs passes its ``connection_timeout`` and ``read_timeout`` to whole-blob uploads and downloads only; the
    rest (block uploads, ranged reads, listings) had the SDK's defaults, and sends had no deadline.
    """
    import aiohttp
    from azure.core.pipeline.transport import AioHttpTransport
    from fsspec.asyn import sync

    old = fs.service_client

    async def build() -> Any:
        session = aiohttp.ClientSession(
            request_class=request_class_with_send_deadline(),
            trust_env=True,
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
        )  # the SDK's own
        transport = AioHttpTransport(
            session=session,
            session_owner=True,
            connection_timeout=connection_timeout,
            read_timeout=read_timeout,
            connection_data_block_size=256 * 1024,
        )
        client = type(old)(
            old.primary_endpoint,
            credential=old.credential,  # the endpoint keeps a SAS token
            secondary_hostname=old.secondary_hostname,
            transport=transport,
            **retry,
        )
        if old.location_mode != client.location_mode:
            client.location_mode = old.location_mode
        return client

    fs.service_client = sync(fs.loop, build)
    sync(fs.loop, old.close)  # never opened: nothing to wait for, but its transport is let go of
