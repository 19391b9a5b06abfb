"""Daytona sandboxes through the official `daytona` SDK (pip install 'playrun[daytona]')."""

from tasks.sandbox.providers.daytona.provider import DaytonaProvider

__all__ = ["DaytonaProvider"]
