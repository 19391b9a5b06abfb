"""The sample play: greets, reports progress as it goes, returns JSON."""

import time


def run(ctx, input):
    name = input.get("name", "world")
    ctx.log("starting", name=name)
    letters = []
    for i, letter in enumerate(name):
        letters.append(letter.upper())
        ctx.log("letter", index=i, letter=letter)
        time.sleep(0.05)
    ctx.log("done", count=len(letters))
    return {"greeting": f"Hello, {name}!", "shout": "".join(letters)}
