"""A short play for the recovery bench: notes that it ran, naps, returns its index.

Besides the run ledger, each execution appends its index to `input["mark"]` (a file on
the host, outside any fence), so a play that ran twice is seen even if the ledger never
heard of the second execution.
"""

import os
import time


def run(ctx, input):
    ctx.log("ran", i=input["i"])
    mark = input.get("mark")
    if mark:
        try:
            fd = os.open(mark, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            try:
                os.write(fd, f"{input['i']}\n".encode())
            finally:
                os.close(fd)
        except OSError:
            pass
    time.sleep(float(input.get("seconds", 1)))
    return {"i": input["i"]}
