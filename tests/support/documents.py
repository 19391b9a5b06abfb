"""Result documents a hostile runner might write (hypothesis strategies), and settling one
through the reader on whichever database the test uses."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

import tasks
from tasks.constants import MAX_RESULT_FILE_BYTES
from tasks.errors import DocumentInvalidError
from tasks.parse import untrusted
from tasks.settlement.outcome import from_result
from tasks.settlement.terminal import settle
from tests.support.runs import must_claim, new_run

ODD_TEXT = st.text(alphabet=st.sampled_from(
    ["a", "\x00", "\ud800", "\udfff", "\u2028", "é", "\"", "\\", "\U0001f600", "\n"]),
    max_size=12)
NUMBERS = st.sampled_from(["0", "-0", "1e400", "-1e400", "1e-400", "9" * 30, "-" + "9" * 19,
                           "9223372036854775807", "9223372036854775808", "NaN", "Infinity",
                           "-Infinity", "1.5", "01", "1e", ".5", "0x10"])


def _leaf_text() -> st.SearchStrategy[str]:
    return st.one_of(NUMBERS, ODD_TEXT.map(json.dumps),
                     st.sampled_from(["true", "false", "null", '"\\u0000"', '"\\ud800"']))


JSONISH = st.recursive(
    _leaf_text(),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda xs: "[" + ",".join(xs) + "]"),
        st.lists(st.tuples(ODD_TEXT.map(json.dumps), inner), max_size=4).map(
            lambda kv: "{" + ",".join(f"{k}:{v}" for k, v in kv) + "}"),
    ),
    max_leaves=20,
)

RESULTS = JSONISH.map(lambda inner: '{"status": "succeeded", "output": ' + inner + "}")


def settle_document(raw: str | bytes) -> tuple[str, str | None, Any]:
    fence = must_claim(new_run())
    outcome = from_result(raw.encode("utf-8", "surrogatepass") if isinstance(raw, str)
                          else raw)
    settle(fence, outcome, reason="ended")
    view = tasks.get_run(fence.run_id)
    return view.status, view.code, view.output


def check_settled(raw: str | bytes, status: str, code: str | None, output: Any) -> None:
    assert status in {"succeeded", "failed"}
    try:
        body = untrusted.parse(raw, max_bytes=MAX_RESULT_FILE_BYTES)
    except DocumentInvalidError:
        assert (status, code) == ("failed", "OUTPUT_INVALID")
        return
    if status == "succeeded":
        assert output == body["output"]  # stored and read back unchanged
    else:
        assert code in {"OUTPUT_INVALID", "PLAY_ERROR"}
