#!/usr/bin/env bash
# The postgres:15 contract the compose stack relies on, for the test image:
#   - `postgres ARGS` (or just `-c ...`) runs the server as the postgres user;
#   - on an empty PGDATA: initdb (superuser POSTGRES_USER with POSTGRES_PASSWORD), loopback and
#     socket connections trusted as initdb sets them, every other address by password
#     (POSTGRES_HOST_AUTH_METHOD, scram-sha-256); POSTGRES_DB created; then the files of
#     /docker-entrypoint-initdb.d in name order (*.sql with psql into POSTGRES_DB, *.sh run or
#     sourced) against a temporary server that listens on the socket only, started with the
#     same ARGS;
#   - anything else is run as it is (the compose writer uses the image for psql).
set -euo pipefail

if [[ ${1:-} == -* ]]; then set -- postgres "$@"; fi
if [[ ${1:-} != postgres ]]; then exec "$@"; fi

if ((EUID == 0)); then
  mkdir -p "$PGDATA"
  chown postgres:postgres "$PGDATA"
  chmod 700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
: "${POSTGRES_HOST_AUTH_METHOD:=scram-sha-256}"

if [[ ! -s $PGDATA/PG_VERSION ]]; then
  if [[ -z ${POSTGRES_PASSWORD:-} && $POSTGRES_HOST_AUTH_METHOD != trust ]]; then
    echo "postgres: POSTGRES_PASSWORD is not set (or set POSTGRES_HOST_AUTH_METHOD=trust)" >&2
    exit 1
  fi
  # shellcheck disable=SC2086 # POSTGRES_INITDB_ARGS is a list of arguments
  initdb --username="$POSTGRES_USER" --pwfile=<(printf '%s\n' "${POSTGRES_PASSWORD:-}") \
    ${POSTGRES_INITDB_ARGS:-}
  printf '\nhost all all all %s\n' "$POSTGRES_HOST_AUTH_METHOD" >>"$PGDATA/pg_hba.conf"

  temp_opts=$(printf '%q ' "${@:2}" -c listen_addresses= -p 5432)
  PGUSER=$POSTGRES_USER pg_ctl -D "$PGDATA" -o "$temp_opts" -w start
  psql_args=(-v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --no-password --no-psqlrc)
  if [[ $POSTGRES_DB != postgres ]]; then
    # From stdin: psql interpolates :"db" there, not in -c.
    psql "${psql_args[@]}" --dbname postgres --set db="$POSTGRES_DB" <<<'CREATE DATABASE :"db"'
  fi
  for f in /docker-entrypoint-initdb.d/*; do
    [[ -e $f ]] || continue
    case $f in
      *.sql)
        echo "postgres init: running $f" >&2
        psql "${psql_args[@]}" --dbname "$POSTGRES_DB" -f "$f"
        ;;
      *.sh)
        echo "postgres init: running $f" >&2
        if [[ -x $f ]]; then "$f"; else
          # shellcheck disable=SC1090
          . "$f"
        fi
        ;;
      *) echo "postgres init: ignoring $f" >&2 ;;
    esac
  done
  PGUSER=$POSTGRES_USER pg_ctl -D "$PGDATA" -m fast -w stop
  echo "postgres init: done; starting the server" >&2
fi

exec "$@"
