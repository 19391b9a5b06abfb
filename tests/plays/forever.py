import time


def run(ctx, input):
    ctx.log("looping")
    while True:
        time.sleep(0.1)
