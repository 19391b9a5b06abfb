"""Logs, then kills its own runner process the way the OOM killer would."""

import os
import signal


def run(ctx, input):
    ctx.log("about to die")
    os.kill(os.getpid(), signal.SIGKILL)
