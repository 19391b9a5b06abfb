"""Celery settings for playrun, chosen for safety; each line says why.

Broker and result backend come from PLAYRUN_REDIS_URL (read once, in tasks.settings).
"""

from __future__ import annotations

from kombu import Exchange, Queue

from tasks.constants import MAINTENANCE_QUEUE, QUEUE, RELEASE_QUEUE
from tasks.settings import get_settings
from tasks.store.netguard import celery_backend_options, redis_socket_options
from tasks.store.redisconn import celery_settings

_settings = get_settings()
# A redis+sentinel:// URL becomes Celery's sentinel:// list and a master_name option.
_redis = celery_settings(_settings.redis_url)

broker_url = _redis["broker_url"]
if _redis["transport"]:  # not a unix socket or another broker
    broker_transport = _redis["transport"]
result_backend = _redis["result_backend"]
# The URL as playrun's own clients read it (tasks/broker/lean.py pushes with one of them).
playrun_redis_url = _settings.redis_url

# Ack after the task finishes, so a task whose worker dies is delivered again;
# the SQL claim makes that redelivery safe (a play never runs twice).
task_acks_late = True
# A child killed by SIGKILL/OOM must requeue its task, not fail it.
task_reject_on_worker_lost = True
# One message per process: a slow sandbox start must not hide queued runs from idle workers.
worker_prefetch_multiplier = 1
# Redis redelivers unacked messages after this; it must outlive every countdown we schedule
# (checked in Settings.check), or a waiting message would be delivered twice.
broker_transport_options = {"visibility_timeout": _settings.visibility_timeout_s,
                            **_redis["transport_options"],
                            # A half-open broker connection fails and is replaced, never
                            # waited on forever (tasks/store/netguard.py).
                            **redis_socket_options(_settings.network_timeout_s)}
_backend = celery_backend_options(_settings.network_timeout_s)
redis_socket_timeout = _backend["redis_socket_timeout"]
redis_socket_connect_timeout = _backend["redis_socket_connect_timeout"]
redis_socket_keepalive = _backend["redis_socket_keepalive"]
redis_backend_health_check_interval = _backend["redis_backend_health_check_interval"]
result_backend_transport_options = {"visibility_timeout": _settings.visibility_timeout_s,
                                    **_redis["transport_options"]}
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
task_queues = tuple(Queue(name, Exchange(name, type="direct"), routing_key=name)
                    for name in (QUEUE, MAINTENANCE_QUEUE, RELEASE_QUEUE))
task_default_exchange = QUEUE
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
