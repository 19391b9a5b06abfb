"""Parse throughput of the one untrusted reader (tasks/parse/untrusted.py), side by side
with the plain decoders, on what sandboxes send: a result document, a progress batch, a
sheet page, and a hostile body of two million tiny values.

    python bench/bench_parse.py [--rounds 7]

Readers, each timed on the same bytes in the same process (best of --rounds, rounds
interleaved so noise falls on every reader alike):
  json.loads        the standard library, no checks (the baseline)
  reference         untrusted.parse_reference: the standard library with hooks, then a
                    storable copy (strict JSON, depth, integer range, storable text); the
                    answer the reader must give, and the reader where orjson is missing
  unbounded         untrusted.parse without a value bound: orjson, then one walk that
                    checks what orjson reads differently; the reference reads what orjson
                    refuses or the walk doubts
  bounded           untrusted.parse(max_values=PLAYRUN_GATEWAY_MAX_BODY_VALUES): what the
                    gateway runs; a body past the bound is refused before it is decoded
  orjson, msgspec   where installed: the plain C decoders, no checks (they differ from the
                    reader on NaN, big integers, lone surrogates and depth)
Figures: MB/s and values/s (values: brackets, commas and colons, what decoding costs), and
each reader's time as a ratio of json.loads's. A refused document shows its time to refuse.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tasks.errors import DocumentInvalidError  # noqa: E402
from tasks.parse import untrusted  # noqa: E402
from tasks.settings import Settings  # noqa: E402

LIMIT = 4 << 20


def documents() -> dict[str, bytes]:
    result = {"rows": [{"id": i, "name": f"company {i}", "domain": f"c{i}.example",
                        "score": i / 7, "tags": ["lead", "b2b"], "ok": i % 2 == 0}
                       for i in range(9000)]}
    progress = {"action": "append_run_events", "idempotency_key": "l:1-500:0",
                "delivery_lease_owner": "runner:l", "dropped": 0,
                "events": [{"seq": i, "at": 1_700_000_000.0 + i, "kind": "progress",
                            "message": "row done", "fields": {"row": i, "status": "ok"}}
                           for i in range(500)]}
    sheet = {"action": "sheet_write", "sheet": "leads",
             "rows": [{f"col{c}": f"value {r}-{c}" for c in range(10)} for r in range(1000)]}
    return {
        "result document": json.dumps(result).encode(),
        "progress batch (500 events)": json.dumps(progress).encode(),
        "sheet page (1,000 rows x 10)": json.dumps(sheet).encode(),
        "hostile: 2 million zeros": b"[" + b"0," * 1_999_999 + b"0]",
    }


def readers(max_values: int) -> dict[str, Callable[[bytes], Any]]:
    found: dict[str, Callable[[bytes], Any]] = {
        "json.loads": json.loads,
        "reference": lambda raw: untrusted.parse_reference(raw, max_bytes=LIMIT),
        "unbounded": lambda raw: untrusted.parse(raw, max_bytes=LIMIT),
        "bounded": lambda raw: untrusted.parse(raw, max_bytes=LIMIT, max_values=max_values),
    }
    for name, attr in (("orjson", "loads"), ("msgspec", "json.decode")):
        try:
            module = importlib.import_module(name if name == "orjson" else "msgspec.json")
        except ImportError:
            continue
        found[name] = getattr(module, attr.split(".")[-1])
    return found


def timed(read: Callable[[bytes], Any], raw: bytes) -> tuple[float, bool]:
    t0 = time.perf_counter()
    try:
        read(raw)
        accepted = True
    except (DocumentInvalidError, ValueError):
        accepted = False
    return time.perf_counter() - t0, accepted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    max_values = Settings().gateway_max_body_values
    docs, found = documents(), readers(max_values)
    best: dict[tuple[str, str], float] = {}
    verdict: dict[tuple[str, str], bool] = {}
    for _ in range(args.rounds):
        for doc, raw in docs.items():
            for name, read in found.items():
                spent, accepted = timed(read, raw)
                key = (doc, name)
                best[key] = min(best.get(key, spent), spent)
                verdict[key] = accepted
    print(f"readers side by side, best of {args.rounds}; bound {max_values:,} values; "
          f"{', '.join(found)}")
    for doc, raw in docs.items():
        values = untrusted.structure_count(raw)
        print(f"\n{doc}: {len(raw) / 1e6:.2f} MB, {values:,} values")
        base = best[(doc, "json.loads")]
        for name in found:
            spent = best[(doc, name)]
            what = "accepted" if verdict[(doc, name)] else "refused"
            print(f"  {name:11} {spent * 1000:8.1f} ms {len(raw) / spent / 1e6:8.1f} MB/s "
                  f"{values / spent / 1e6:7.2f} M values/s {spent / base:6.2f}x  {what}")


if __name__ == "__main__":
    main()
