"""Stands in for Modal's /__modal/.bin/modal-sandbox-fs-tools inside the double's sandboxes.

    modal_fs_tools.py '{"WriteFile": {"path": P}}'   (the data comes on stdin)

The commands are the SDK's JSON (modal/_utils/sandbox_fs_utils.py); a failure prints
{"error_kind", "message"} on stderr and exits 1, as the SDK expects.
"""

import json
import os
import shutil
import sys


def fail(kind, message):
    print(json.dumps({"error_kind": kind, "message": message}), file=sys.stderr)
    raise SystemExit(1)


def main(command):
    op, args = next(iter(command.items()))
    path = args["path"]
    try:
        if op == "WriteFile":
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "wb") as fh:
                shutil.copyfileobj(sys.stdin.buffer, fh)
        elif op == "ReadFile":
            with open(path, "rb") as fh:
                shutil.copyfileobj(fh, sys.stdout.buffer)
        elif op == "MakeDirectory":
            os.makedirs(path, exist_ok=args.get("parents", True))
        elif op == "Remove":
            if os.path.isdir(path) and args.get("recursive"):
                shutil.rmtree(path)
            elif os.path.isdir(path):
                os.rmdir(path)
            else:
                os.unlink(path)
        else:
            fail("Unsupported", f"{op} is not supported by the double")
    except FileNotFoundError:
        fail("NotFound", "path does not exist")
    except IsADirectoryError:
        fail("IsDirectory", "path is a directory")
    except NotADirectoryError:
        fail("NotDirectory", "a component of the path is not a directory")
    except PermissionError:
        fail("PermissionDenied", "permission denied")


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
