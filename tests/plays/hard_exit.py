"""Ends its own runner hard, the way `input["how"]` says, without the runner settling.
With `input["marker"]`, a file on the host, it writes its time there just before the end
(only where the play can reach the host's files: process isolation, the cloud doubles)."""

import os
import signal
import time

RESULTS = {
    "nested": '{"status": "succeeded", "output": ' + "[" * 10_000 + "]" * 10_000 + "}",
    "huge_number": '{"status": "succeeded", "output": 1e400}',
}


def run(ctx, input):
    how = input["how"]
    if how in RESULTS:
        with open("result.json", "w") as fh:
            fh.write(RESULTS[how])
    elif how == "symlink":
        os.symlink("/etc/passwd", "result.json")
    if input.get("marker"):
        with open(input["marker"], "w") as fh:
            fh.write(repr(time.time()))
    if how == "killpg":
        # 0: the caller's own group (in a strict sandbox its leader is pid 1, and
        # killpg(1) would mean every process but init).
        os.killpg(0, signal.SIGKILL)
    elif how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(0)
