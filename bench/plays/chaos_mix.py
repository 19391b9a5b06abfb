"""The chaos suite's play: input["kind"] picks short, long, fail or step.

Every execution appends its index to input["mark"] (a file on the host, outside any
fence) before anything else, so a run whose play executed twice is seen even when the
ledger never heard of the second execution. A step's fn appends to input["step_mark"].
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
    time.sleep(float(input.get("seconds", 0.1)))
    return {"i": i}
