#!/bin/sh
# Contribution-report throughput (issue 6): 1,000 simulated agents report
# every step to one coordinator on loopback (bench_reports.c does the work).
# PostgreSQL runs with its default durability (fsync on, synchronous_commit
# on). Goals on the 2-core machine: >= 5,000 reports/s sustained, p99 under
# 100 ms. BENCH_REPORTS_AGENTS, _GROUP, _RATE, _SECONDS, _THREADS override.
set -eu
cd "$(dirname "$0")/../.."
BIN=build/bin
AGENTS=${BENCH_REPORTS_AGENTS:-1000}
GROUP=${BENCH_REPORTS_GROUP:-8}
RATE=${BENCH_REPORTS_RATE:-5000}
SECS=${BENCH_REPORTS_SECONDS:-10}
THREADS=${BENCH_REPORTS_THREADS:-4}
work=$(mktemp -d /tmp/ct-bench-reports-XXXXXX)
chmod 755 "$work"
pid=""
cleanup() {
  [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  ./scripts/pg-temp.sh stop "$work/pg" || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
ulimit -n 8192 2>/dev/null || true
db=$(PG_EXTRA_OPTS="-c max_connections=200" ./scripts/pg-temp.sh start "$work/pg")
echo "bench-organizer-pw" | $BIN/crowdtrain-coordinator create-user --database-url "$db" \
  --username org --role organizer --password-stdin >/dev/null 2>&1
# every simulated agent connects from 127.0.0.1: no per-address cap
$BIN/crowdtrain-coordinator serve --database-url "$db" --listen 127.0.0.1:0 --data-dir "$work/coord" \
  --threads "$THREADS" --db-pool 16 --max-connections-per-ip 0 \
  --log-level ${BENCH_REPORTS_LOG:-warn} >"$work/coord.log" 2>&1 &
pid=$!
i=0
while [ ! -s "$work/coord/coordinator.url" ]; do i=$((i + 1)); [ $i -gt 200 ] && { cat "$work/coord.log"; exit 1; }; sleep 0.1; done
url=$(cat "$work/coord/coordinator.url")
echo "coordinator: $THREADS HTTP threads (reports park their connection until the group commit)"
trap '[ -n "${BENCH_REPORTS_KEEPLOG:-}" ] && grep -E "${BENCH_REPORTS_KEEPGREP:-contrib}" "$work/coord.log" > "$BENCH_REPORTS_KEEPLOG"; cleanup' EXIT INT TERM
BENCH_REPORTS_COORD_PID=$pid BENCH_REPORTS_PG_PID=$(head -n 1 "$work/pg/data/postmaster.pid") \
build/tests/bench/bench_reports "$url" "$work/coord/tls-cert.pem" "$db" bench-organizer-pw \
  "$AGENTS" "$GROUP" "$RATE" "$SECS"
