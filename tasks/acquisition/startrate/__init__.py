"""Fleet-wide sandbox start-rate bucket: GCRA pacing with an AIMD-adapted rate (docs/design.md)."""

from tasks.acquisition.startrate.bucket import StartRateLimiter, rules_for
from tasks.acquisition.startrate.fallback import LocalStartRateLimiter
from tasks.acquisition.startrate.maths import Penalty, Permit, RateRule, RuleState

__all__ = [
    "LocalStartRateLimiter",
    "Penalty",
    "Permit",
    "RateRule",
    "RuleState",
    "StartRateLimiter",
    "rules_for",
]
