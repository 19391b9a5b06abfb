"""What a worker process runs: the Celery tasks, its start-up checks, its liveness watchdog."""
