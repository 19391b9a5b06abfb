"""How app code uses playrun (after `playrun db upgrade` and `celery -A tasks worker`)."""

import tasks

run = tasks.submit_run("examples/plays/hello.py", input={"name": "Ada"}, org_id="acme",
                       idempotency_key="req-42")
result = run.wait(timeout=60)
print(result.status, result.output, result.code, result.error)
for event in tasks.run_events(run.id):
    print(event.at.isoformat(), event.kind, event.data)
