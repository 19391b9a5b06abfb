"""The Celery app and everything that publishes to the broker."""
