"""A hostile play: sends its runner's token with bodies the gateway refuses, as fast as it
can, ignoring every answer and every Retry-After, until the gateway stops serving it."""

import json
import time


def run(ctx, input):
    uplink = ctx._uplink  # the runner's line to the gateway: a play can always reach it
    sent = 0
    while True:
        _status, raw = uplink.gateway._exchange(b"{not json", uplink.token)
        sent += 1
        if json.loads(raw).get("code") not in ("GATEWAY_BAD_REQUEST", "GATEWAY_RATE_LIMITED"):
            break
    time.sleep(60)  # the gateway has failed this run: its sandbox is deleted under it
    return {"sent": sent}
