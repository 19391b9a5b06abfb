import time


def run(ctx, input):
    seconds = float(input.get("seconds", 3))
    ctx.log("sleeping", seconds=seconds)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)
    ctx.log("awake")
    return {"slept": seconds}
