# First start (an empty data directory): a cluster whose superuser is
# POSTGRES_USER with POSTGRES_PASSWORD (password checked for connections
# over the network, not over the socket), listening on every address, and
# the database POSTGRES_DB. Every start: the server in the foreground.
set -eu
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  password_file=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" > "$password_file"
  initdb --username="$POSTGRES_USER" --pwfile="$password_file" \
    --auth-local=trust --auth-host=scram-sha-256 -D "$PGDATA"
  rm -f "$password_file"
  echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  pg_ctl -D "$PGDATA" -w start -o "-c listen_addresses=''"
  if [ "$POSTGRES_DB" != postgres ]; then
    createdb --username="$POSTGRES_USER" "$POSTGRES_DB"
  fi
  pg_ctl -D "$PGDATA" -w stop
fi
exec postgres -D "$PGDATA"
