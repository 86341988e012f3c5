#!/bin/sh
# Temporal's persistence and visibility databases on PostgreSQL: created if missing, schemas
# brought to the version this admin-tools image ships. Safe to run on every `up`.
set -eu

: "${POSTGRES_SEEDS:?}" "${POSTGRES_USER:?}" "${SQL_PASSWORD:?}"
PORT="${DB_PORT:-5432}"
SCHEMA=/etc/temporal/schema/postgresql/v12

until nc -z -w 5 "$POSTGRES_SEEDS" "$PORT"; do
  echo "waiting for PostgreSQL at $POSTGRES_SEEDS:$PORT"
  sleep 2
done

sql() {
  temporal-sql-tool --plugin postgres12 --ep "$POSTGRES_SEEDS" -u "$POSTGRES_USER" -p "$PORT" "$@"
}

for db in temporal temporal_visibility; do
  case "$db" in
    temporal) dir="$SCHEMA/temporal/versioned" ;;
    *) dir="$SCHEMA/visibility/versioned" ;;
  esac
  # `create` fails when the database exists; that is the normal case on a second `up`.
  sql --db "$db" create || echo "database $db exists"
  sql --db "$db" setup-schema -v 0.0
  sql --db "$db" update-schema -d "$dir"
done
echo "Temporal schema is up to date"
