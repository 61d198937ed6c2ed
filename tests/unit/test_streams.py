"""``shared.streams.by_stream``: XREAD and XREADGROUP replies in one shape under RESP2, RESP3 and unified replies."""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest
from redis._parsers.helpers import parse_xread, parse_xread_resp3, parse_xread_unified

from shared.streams import by_stream

WIRE = [["a", [["1-0", ["f", "v"]], ["1-1", None]]], ["b", [["2-0", ["g", "w"]]]]]
"""An XREAD answer as the server sends it: two streams, the second entry of ``a`` deleted while pending."""
EXPECTED = {"a": [("1-0", {"f": "v"}), ("1-1", {})], "b": [("2-0", {"g": "w"})]}


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(parse_xread(WIRE), id="resp2"),
        pytest.param(parse_xread_resp3(dict(WIRE)), id="resp3"),
        pytest.param(parse_xread_unified(dict(WIRE)), id="unified"),
    ],
)
def test_every_reply_shape_reads_the_same(reply: Any) -> None:
    assert by_stream(reply) == EXPECTED


@pytest.mark.parametrize("reply", [None, [], {}, parse_xread(None), parse_xread_resp3(None)])
def test_no_reply_is_no_stream(reply: Any) -> None:
    assert by_stream(reply) == {}


def test_a_stream_with_no_entries_reads_empty() -> None:
    assert by_stream({"a": [[]]}) == {"a": []}
    assert by_stream({"a": []}) == {"a": []}
    assert by_stream([["a", []]]) == {"a": []}


def test_fields_a_client_left_none_stay_none() -> None:
    assert by_stream([["a", [("1-0", None)]]]) == {"a": [("1-0", None)]}
    assert by_stream({"a": [[("1-0", None)]]}) == {"a": [("1-0", None)]}


@pytest.mark.parametrize("protocol", [2, 3])
def test_real_replies_of_both_protocols(protocol: int) -> None:
    client = fakeredis.FakeRedis(decode_responses=True, protocol=protocol)
    client.xgroup_create("s", "g", id="0", mkstream=True)
    kept = client.xadd("s", {"f": "v"})
    gone = client.xadd("s", {"g": "w"})
    assert by_stream(client.xread({"s": "0"})) == {"s": [(kept, {"f": "v"}), (gone, {"g": "w"})]}
    assert by_stream(client.xreadgroup("g", "c", {"s": ">"}))["s"] == [(kept, {"f": "v"}), (gone, {"g": "w"})]
    client.xdel("s", gone)
    assert by_stream(client.xreadgroup("g", "c", {"s": "0"})) == {"s": [(kept, {"f": "v"}), (gone, {})]}
    assert by_stream(client.xreadgroup("g", "c", {"s": ">"}, block=1)) == {}
