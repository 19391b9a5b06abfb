"""Appends one line to input["path"] each time it really runs (proves run-once)."""

import os
import time


def run(ctx, input):
    with open(input["path"], "a") as fh:
        fh.write(f"{os.getpid()}\n")
    time.sleep(float(input.get("seconds", 0.5)))
    return {"ok": True}
