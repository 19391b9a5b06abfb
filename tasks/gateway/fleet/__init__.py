"""Per-attempt gateway budgets kept in Redis for every gateway process and host
(docs/design.md): maths.py the reference, lua/ the scripts, store.py the calls, limits.py
what the app checks (with the in-memory budgets while Redis does not answer)."""
