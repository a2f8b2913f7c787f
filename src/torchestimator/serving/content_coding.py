"""Request bodies sent with a Content-Encoding: gzip and deflate are decoded here, within the body limit.

TF Serving inflates gzip request bodies (net_http's evhttp_request.cc). aiohttp
would too, but inside its HTTP parser, where a body that does not inflate
breaks the connection and surfaces as an exception the handler cannot tell
from a server fault. So app.py turns aiohttp's decompression off and calls
``decode_content`` on the raw bytes: a body that does not decode is a 400 on a
connection that stays open, and an inflated size beyond the limit is a 413
found without inflating more than the limit (a small "zip bomb" stays small).
"""

from __future__ import annotations

import zlib

from torchestimator.errors import BodyTooLarge
from torchestimator.serving.errors import invalid_argument

__all__ = ["SUPPORTED_CODINGS", "BodyTooLarge", "decode_content"]

# Content coding -> zlib's wbits: gzip's header and trailer, or zlib's (RFC 9110 8.4.1).
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
SUPPORTED_CODINGS = ("identity", *_WBITS)


def decode_content(body: bytes, content_encoding: str | None, limit: int) -> bytes:
    """``body`` with its codings undone, last applied first.

    ServingError (400) when a coding is unknown or the bytes do not decode; BodyTooLarge past ``limit``.
    """
    codings = [coding.strip().lower() for coding in (content_encoding or "").split(",")]
    codings = [coding for coding in codings if coding and coding != "identity"]
    unsupported = [coding for coding in codings if coding not in _WBITS]
    if unsupported:
        raise invalid_argument(
            f"Content-Encoding {content_encoding!r} is not supported; send the body as is or "
            f"with one of {', '.join(SUPPORTED_CODINGS)}."
        )
    for coding in reversed(codings):
        body = _inflate(body, coding, content_encoding or "", limit)
    return body


def _inflate(body: bytes, coding: str, header: str, limit: int) -> bytes:
    inflater = zlib.decompressobj(_WBITS[coding])
    try:
        inflated = inflater.decompress(body, limit + 1)  # at most limit + 1 bytes: enough to know it is too much
    except zlib.error as error:
        raise invalid_argument(
            f"The request body is not valid {coding} data ({error}), though its Content-Encoding "
            f"header says {header!r}. Compress the body with {coding}, or drop the "
            "header."
        ) from None
    if len(inflated) > limit:
        raise BodyTooLarge(f"The request body inflates ({coding}) to more than the limit of {limit} bytes.")
    if not inflater.eof:
        raise invalid_argument(
            f"The request body's {coding} data is truncated (its end marker is missing); send "
            "the whole compressed body."
        )
    if inflater.unused_data:
        raise invalid_argument(
            f"The request body has {len(inflater.unused_data)} bytes after the end of its {coding} "
            "data; send one compressed stream."
        )
    return inflated
