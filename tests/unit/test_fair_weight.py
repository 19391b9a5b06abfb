"""An org's weight in the fair order of starts: a whole number from 1 to 1000."""

from __future__ import annotations

import pytest

from tasks.errors import InputInvalidError
from tasks.parse.checks import check_weight


def test_weight_bounds() -> None:
    assert check_weight(1) == 1 and check_weight(1000) == 1000 and check_weight("42") == 42
    for bad in (0, 1001, True, 2.0, None):
        with pytest.raises(InputInvalidError):
            check_weight(bad)
