#!/bin/sh
# Writes pgbouncer.ini and its auth file from the environment, then runs pgbouncer.
# PGBOUNCER_UPSTREAM_HOST/PORT: PostgreSQL; PGBOUNCER_USER/PASSWORD: the one role clients
# log in as (SCRAM with clients and the server); PGBOUNCER_POOL_SIZE: server connections
# per database; PGBOUNCER_MAX_CLIENTS: client connections (docs/operations.md "Connections").
set -eu
dir="${PGBOUNCER_DIR:-/tmp/pgbouncer}"
mkdir -p "$dir"
umask 077
printf '"%s" "%s"\n' "$PGBOUNCER_USER" "$PGBOUNCER_PASSWORD" > "$dir/userlist.txt"
cat > "$dir/pgbouncer.ini" <<INI
[databases]
* = host=${PGBOUNCER_UPSTREAM_HOST:-postgres} port=${PGBOUNCER_UPSTREAM_PORT:-5432}

[pgbouncer]
listen_addr = ${PGBOUNCER_LISTEN_ADDR:-0.0.0.0}
listen_port = ${PGBOUNCER_PORT:-6432}
unix_socket_dir = $dir
auth_type = scram-sha-256
auth_file = $dir/userlist.txt
pool_mode = transaction
default_pool_size = ${PGBOUNCER_POOL_SIZE:-20}
max_client_conn = ${PGBOUNCER_MAX_CLIENTS:-1000}
; playrun's clients send no startup options behind PgBouncer (PLAYRUN_DB_PGBOUNCER):
; this ends a transaction whose client went silent, as idle_in_transaction_session_timeout
; does on a direct connection (twice PLAYRUN_NETWORK_TIMEOUT_S).
idle_transaction_timeout = ${PGBOUNCER_IDLE_TRANSACTION_TIMEOUT:-20}
INI
exec /usr/sbin/pgbouncer "$dir/pgbouncer.ini"
