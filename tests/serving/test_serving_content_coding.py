"""Request bodies with a Content-Encoding: decoded within the body limit, or refused with a 400 that says why."""

from __future__ import annotations

import gzip
import zlib

import pytest

from torchestimator.serving import ServingError
from torchestimator.serving.content_coding import BodyTooLarge, decode_content

BODY = b'{"instances": [1.0, 2.0]}'


@pytest.mark.parametrize(
    "encoding, data",
    [
        (None, BODY),
        ("", BODY),
        ("identity", BODY),
        ("gzip", gzip.compress(BODY)),
        ("x-gzip", gzip.compress(BODY)),
        ("GZIP", gzip.compress(BODY)),
        ("deflate", zlib.compress(BODY)),
        ("deflate, gzip", gzip.compress(zlib.compress(BODY))),  # applied in the order listed: undone last first
    ],
)
def test_supported_codings_decode(encoding, data):
    assert decode_content(data, encoding, limit=1000) == BODY


@pytest.mark.parametrize(
    "encoding, data, words",
    [
        ("gzip", BODY, "not valid gzip data"),
        ("deflate", BODY, "not valid deflate data"),
        ("gzip", gzip.compress(BODY)[:-12], "truncated"),
        ("gzip", gzip.compress(BODY) + b"tail", "4 bytes after the end"),
        ("br", BODY, "'br' is not supported"),
        ("gzip, compress", gzip.compress(BODY), "not supported"),
    ],
)
def test_bodies_that_do_not_decode_are_invalid_arguments_saying_why(encoding, data, words):
    with pytest.raises(ServingError) as refused:
        decode_content(data, encoding, limit=1000)
    assert refused.value.http_status == 400 and words in refused.value.message


def test_a_body_inflating_past_the_limit_is_refused_without_inflating_it_all():
    bomb = gzip.compress(b"\0" * (50 << 20))  # 50 MB of zeros in about 50 KB
    with pytest.raises(BodyTooLarge, match="more than the limit of 1000000 bytes"):
        decode_content(bomb, "gzip", limit=1_000_000)
    assert len(decode_content(gzip.compress(b"\0" * 1000), "gzip", limit=1000)) == 1000  # exactly the limit is fine
