"""`playrun gateway` as an older release that does not offer the write-intent sheet start:
the real gateway, with that action taken out of its table before it serves."""

from __future__ import annotations

import sys

from tasks.cli.main import main
from tasks.gateway.actions import ACTIONS
from tasks.protocol import ACTION_SHEET_START_WITH_INTENT

if __name__ == "__main__":
    del ACTIONS[ACTION_SHEET_START_WITH_INTENT]
    sys.argv = ["playrun", "gateway"]
    main()
