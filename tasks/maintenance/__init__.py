"""Maintenance run by `celery -A tasks beat`: outbox sweep, reaper, sandbox GC."""
