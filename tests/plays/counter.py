"""Counts its real runs: one progress line each time, and one line appended to
input["path"] when given (a host file: process isolation only)."""

import os
import time


def run(ctx, input):
    ctx.log("ran", pid=os.getpid())
    if input.get("path"):
        with open(input["path"], "a") as fh:
            fh.write(f"{os.getpid()}\n")
    time.sleep(float(input.get("seconds", 0.5)))
    return {"ok": True}
