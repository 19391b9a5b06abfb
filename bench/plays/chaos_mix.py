"""The chaos suite's play: input["kind"] picks short, long, fail, step or sheet.

Every execution appends its index to input["mark"] (a file on the host, outside any
fence) before anything else, so a run whose play executed twice is seen even when the
ledger never heard of the second execution. A step's fn appends to input["step_mark"];
a sheet row's fn appends "index:key" to input["row_mark"].
"""

import os
import time


def _append(path, line):
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            os.write(fd, f"{line}\n".encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def sheet_value(i, n):
    """What row n of run i's sheet must hold: the harness checks the sheet against it."""
    return {"k": f"r{n:03d}", "v": n * 7 + i}


def _sheet(ctx, input, i):
    # A table per run: another run of this play on the same table would supersede its rows.
    sheet = ctx.sheet(f"chaos-{input['tag']}-{i}")
    pause = float(input.get("row_s", 0.2))

    def enrich(row):
        _append(input.get("row_mark"), f"{i}:{row['k']}")
        time.sleep(pause)  # rows take a while, so a fault lands between the sheet's writes
        return sheet_value(i, row["n"])

    rows = [{"k": f"r{n:03d}", "n": n} for n in range(int(input["rows"]))]
    done = sheet.map(rows, enrich, key="k")
    return {"i": i, "rows": len(done), "errors": len(done.errors),
            "write_version": sheet.write_version}


def run(ctx, input):
    i = input["i"]
    _append(input.get("mark"), i)
    kind = input.get("kind", "short")
    ctx.log("ran", i=i, kind=kind)
    if kind == "fail":
        raise RuntimeError("the play failed on purpose")
    if kind == "step":
        def paid():
            _append(input.get("step_mark"), i)
            return {"paid": i}
        out = ctx.step(f"chaos:{input['tag']}:{i}", paid)
        return {"i": i, "step": out}
    if kind == "sheet":
        return _sheet(ctx, input, i)
    time.sleep(float(input.get("seconds", 0.1)))
    return {"i": i}
