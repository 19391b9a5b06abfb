"""Returns the runner's start record (the boot script's .playrun/started.json, written as
the runner process starts) so a benchmark can time submit -> runner started."""

import json
import os
import time


def run(ctx, input):
    path = os.path.join(os.getcwd(), ".playrun", "started.json")
    started_at = None
    for _ in range(100):  # the keeper writes it just after starting the runner
        try:
            with open(path) as fh:
                started_at = json.load(fh)["at"]
            break
        except (OSError, ValueError, KeyError):
            time.sleep(0.01)
    return {"started_at": started_at, "play_at": time.time()}
