"""E2B sandboxes: `pip install 'playrun[e2b]'`; the SDK reads E2B_API_KEY itself."""

from tasks.sandbox.providers.e2b.provider import E2BProvider

__all__ = ["E2BProvider"]
