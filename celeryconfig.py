"""Celery settings for playrun, chosen for safety; each line says why.

The result backend is PLAYRUN_REDIS_URL; the broker PLAYRUN_BROKER_URL if set, else the same
Redis (read once, in tasks.settings).
"""

from __future__ import annotations

from tasks.broker.config import broker_settings
from tasks.constants import QUEUE
from tasks.settings import get_settings
from tasks.store.netguard import celery_backend_options
from tasks.store.redisconn import celery_settings

_settings = get_settings()

# The broker (PLAYRUN_BROKER_URL, else PLAYRUN_REDIS_URL) and what follows from it:
# the transport, its options, the queues as that broker declares them
# (tasks/broker/config.py says why each). Results always go to Redis.
_broker = broker_settings(_settings)
broker_url = _broker["broker_url"]
broker_transport = _broker["broker_transport"]
broker_transport_options = _broker["broker_transport_options"]
if "broker_heartbeat" in _broker:
    broker_heartbeat = _broker["broker_heartbeat"]
# A redis+sentinel:// URL becomes Celery's sentinel:// list and a master_name option.
_results = celery_settings(_settings.redis_url)
result_backend = _results["result_backend"]
# The URL as playrun's own clients read it (tasks/broker/lean.py pushes with one of them).
playrun_redis_url = _settings.redis_url
_backend = celery_backend_options(_settings.network_timeout_s)
redis_socket_timeout = _backend["redis_socket_timeout"]
redis_socket_connect_timeout = _backend["redis_socket_connect_timeout"]
redis_socket_keepalive = _backend["redis_socket_keepalive"]
redis_backend_health_check_interval = _backend["redis_backend_health_check_interval"]
result_backend_transport_options = {"visibility_timeout": _settings.visibility_timeout_s,
                                    **_results["transport_options"]}
# On a lost broker connection, cancel the late-acked tasks in flight: they will be
# redelivered anyway, and finishing them would ack nothing.
worker_cancel_long_running_tasks_on_connection_loss = True
broker_connection_retry_on_startup = True
# Task events stay off unless something watches: Flower turns them on in every worker every
# few seconds (its --enable_events, the default), and `worker -E` turns them on for good.
# Always on, they were three broker publishes per task, about 40% of a worker's main
# process. (No task-sent events either: a second publish per submit.)
worker_send_task_events = False
# JSON only: no pickles from the broker.
task_serializer = "json"
result_serializer = "json"
accept_content = ["json"]
# Results are not how callers learn outcomes (SQL is); keep them short-lived.
result_expires = 3600
task_ignore_result = True
# Workers declare their queue; app code only publishes to it.
task_default_queue = QUEUE
# Every worker consumes all three; maintenance and releases never wait behind starts.
task_queues = _broker["task_queues"]
task_default_exchange = QUEUE
task_default_exchange_type = _broker["task_default_exchange_type"]
task_default_routing_key = QUEUE
task_create_missing_queues = False
# Maintenance needs the database at the head revision before it schedules anything.
beat_scheduler = "tasks.maintenance.schedule:CheckedScheduler"
timezone = "UTC"
enable_utc = True
# Tasks are short (acquire, launch, watch a little, hand off); a stuck one is killed.
task_time_limit = 300
task_soft_time_limit = 240
worker_hijack_root_logger = False
# Each worker also consumes its own direct queue: the liveness watchdog pings itself there.
worker_direct = True
