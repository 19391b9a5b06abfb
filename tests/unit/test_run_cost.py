"""bench/run_cost.py's reading of PostgreSQL's statement log (the figures in docs/design.md,
"What each run costs", rest on it); no servers needed."""

from __future__ import annotations

from collections import Counter

from bench.run_cost import derive, tally

LOG = b"""\
@@1 0 db@@ LOG:  statement: ;
@@1 0 db@@ LOG:  execute <unnamed>:
\tWITH items AS (SELECT 1)
\tINSERT INTO runs SELECT * FROM items
@@1 0 db@@ DETAIL:  parameters: $1 = 'x'
@@2 0 db@@ LOG:  statement: BEGIN
@@2 0 db@@ LOG:  execute _pg3_0: SET LOCAL synchronous_commit = off
@@2 0 db@@ LOG:  execute _pg3_1: SELECT runs.id FROM runs WHERE runs.id = $1 FOR UPDATE
@@2 7 db@@ LOG:  execute _pg3_2: UPDATE attempts SET state = $1
@@2 7 db@@ LOG:  statement: COMMIT
@@2 0 db@@ LOG:  statement: BEGIN
@@2 0 db@@ LOG:  execute _pg3_0: SET LOCAL synchronous_commit = off
@@2 0 db@@ LOG:  execute _pg3_3: UPDATE attempts SET lease_expires_at = $1 WHERE false
@@2 0 db@@ LOG:  statement: COMMIT
@@3 0 other@@ LOG:  statement: SELECT 1
@@4 0 db@@ LOG:  statement: BEGIN ISOLATION LEVEL READ COMMITTED
@@4 0 db@@ LOG:  execute _pg3_5: SELECT runs.id FROM runs WHERE runs.id = $1 FOR UPDATE
@@4 9 db@@ LOG:  statement: COMMIT
@@4 0 db@@ LOG:  statement: BEGIN
"""


def test_log_tells_durable_async_read_only_pings_and_autocommit() -> None:
    c: Counter[str] = Counter()
    open_tx: dict[bytes, bool] = {}
    tally(LOG.split(b"\n")[:-1], b"db", open_tx, c)
    assert open_tx == {b"4": False}  # a transaction still open is carried to the next read
    assert c["log.pings"] == 1
    assert c["log.statements"] == 5  # the multi-line INSERT by its first line; not `other`
    assert c["sql: WITH items AS (SELECT 1)"] == 1
    assert c["log.autocommit"] == 1
    assert (c["log.async"], c["log.read_only_explicit"], c["log.durable_explicit"]) == (1, 1, 1)
    assert c["log.tx_control"] == 9
    # Three xids were taken: the autocommit INSERT, the async UPDATE, the lock of pid 4.
    d = derive(Counter({**c, "pg.xids": 3}))
    assert (d["commits"], d["durable"], d["read_only"]) == (5, 2, 1)
    assert d["async"] == 1


def test_an_autocommit_statement_that_turns_off_its_flush_wait_is_async() -> None:
    log = (b"@@5 0 db@@ LOG:  execute <unnamed>: \n\tWITH quick AS (\n\t  SELECT set_config("
           b"'synchronous_commit', 'off', true)) INSERT INTO run_events SELECT 1\n"
           b"@@5 0 db@@ LOG:  execute <unnamed>: INSERT INTO runs SELECT 1\n")
    c: Counter[str] = Counter()
    tally(log.split(b"\n")[:-1], b"db", {}, c)
    d = derive(Counter({**c, "pg.xids": 2}))
    assert (d["commits"], d["durable"], d["async"], d["read_only"]) == (2, 1, 1, 0)
