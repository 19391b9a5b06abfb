"""Work receipts from a play; input["mode"] picks what it does (tests/test_receipts_e2e.py).

The step's fn stands in for a paid API call: each time it really runs it appends a line to
input["counter"], so a test can count the calls.
"""

import os
import signal
import threading
import time


def paid(input):
    with open(input["counter"], "a") as fh:
        fh.write(f"{os.getpid()}\n")
    gate = input.get("gate")
    deadline = time.monotonic() + 60
    while gate and not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"tag": input.get("tag")}


def run(ctx, input):
    mode = input.get("mode", "once")
    key = input.get("key", "lookup:acme.com")
    if mode == "once":
        ctx.log("claiming", key=key)
        return {"out": ctx.step(key, lambda: paid(input), ttl=input.get("ttl"))}
    if mode == "long_key":
        return ctx.step("x" * input["length"], lambda: paid(input))
    if mode == "set":
        return ctx.step(key, lambda: {1, 2})
    if mode == "big":
        return ctx.step(key, lambda: "x" * (300 * 1024))
    if mode == "raises":
        def broken():
            paid(input)
            raise RuntimeError("the paid API broke")
        return ctx.step(key, broken)
    if mode == "recursive":
        return ctx.step(key, lambda: ctx.step(key, lambda: paid(input)))
    if mode == "kill":
        def killed():
            paid(input)
            os.kill(os.getpid(), signal.SIGKILL)
        return ctx.step(key, killed)
    if mode == "stop":
        def stopped():
            paid(input)
            os.kill(os.getpid(), signal.SIGSTOP)  # the whole runner freezes, heartbeats too
        return ctx.step(key, stopped)
    if mode == "hold":
        # A thread holds the step (its fn never returns) while the play ends as asked.
        started = threading.Event()

        def blocked():
            paid(input)
            started.set()
            threading.Event().wait()

        threading.Thread(target=ctx.step, args=(key, blocked), daemon=True).start()
        started.wait(30)
        ctx.log("holding", key=key)
        if input["then"] == "raise":
            raise RuntimeError("the play broke while a step ran")
        if input["then"] == "loop":
            while True:
                time.sleep(0.1)
        return {"held": True}
    raise ValueError(f"unknown mode {mode!r}")
