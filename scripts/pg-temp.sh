#!/bin/sh
# A throwaway PostgreSQL cluster for the demo and benchmarks.
#   scripts/pg-temp.sh start DIR [PORT]   -> prints the database URL
#   scripts/pg-temp.sh stop DIR
# PostgreSQL refuses to run as root, so as root the cluster runs as the
# 'postgres' user (created by Debian's postgresql package). It listens on
# 127.0.0.1 only, with trust authentication limited to that cluster.
set -eu
cmd=$1; dir=$2
bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -x "$bindir/initdb" ] || { echo "pg-temp: PostgreSQL server binaries not found (apt-get install postgresql)" >&2; exit 1; }
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
case $cmd in
start)
  port=${3:-}
  mkdir -p "$dir"
  [ "$(id -u)" -eq 0 ] && chown postgres "$dir"
  chmod 700 "$dir"
  if [ ! -f "$dir/data/PG_VERSION" ]; then
    as_pg "$bindir/initdb" -D "$dir/data" -A trust -U crowdtrain -E UTF8 --no-instructions >"$dir/initdb.log" 2>&1 ||
      { cat "$dir/initdb.log" >&2; exit 1; }
  fi
  # Without a port given, try random high ports until one is free.
  started=0
  for attempt in 1 2 3 4 5 6 7 8; do
    p=${port:-$(shuf -i 20000-59999 -n 1)}
    if as_pg "$bindir/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 30 \
         -o "-p $p -k $dir -c listen_addresses=127.0.0.1 ${PG_EXTRA_OPTS:-}" start >/dev/null; then
      port=$p; started=1; break
    fi
    [ -n "$port" ] && break
  done
  [ "$started" -eq 1 ] || { cat "$dir/postgres.log" >&2; exit 1; }
  as_pg "$bindir/psql" -h 127.0.0.1 -p "$port" -U crowdtrain -d postgres -qAt \
    -c "SELECT 1 FROM pg_database WHERE datname = 'crowdtrain'" | grep -q 1 ||
    as_pg "$bindir/createdb" -h 127.0.0.1 -p "$port" -U crowdtrain crowdtrain
  echo "$port" >"$dir/port"
  echo "postgresql://crowdtrain@127.0.0.1:$port/crowdtrain"
  ;;
stop)
  [ -d "$dir/data" ] && as_pg "$bindir/pg_ctl" -D "$dir/data" -m fast -w -t 30 stop >/dev/null 2>&1 || true
  ;;
*) echo "usage: $0 start|stop DIR [PORT]" >&2; exit 2 ;;
esac
