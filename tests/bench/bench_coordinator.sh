#!/bin/sh
# Coordinator throughput on loopback with wrk: access-pass issuance (POST
# /api/v1/runs/{run}/passes: session lookup, the request's Ed25519
# signature check (proof of key possession), allowlist join, key ownership
# and a durable INSERT in one statement, an Ed25519 signature) and the
# public run list (GET /api/v1/runs),
# against GET /metrics (no database) as the in-run reference for what the
# HTTPS layer alone sustains. PostgreSQL runs with its default durability
# (fsync on, synchronous_commit on).
# Goals (issue 2, 2-core machine): >= 2,000 passes/s and >= 10,000 reads/s,
# p99 under 50 ms. Then the same reads during connection floods (below).
set -eu
cd "$(dirname "$0")/../.."
BIN=build/bin
DUR=${BENCH_SECONDS:-10}
CONNS=${BENCH_CONNECTIONS:-32}
THREADS=${BENCH_COORD_THREADS:-8}
work=$(mktemp -d /tmp/ct-bench-coord-XXXXXX)
chmod 755 "$work"
pid=""
cleanup() {
  [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  ./scripts/pg-temp.sh stop "$work/pg" || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
command -v wrk >/dev/null || { echo "bench_coordinator: wrk not installed (apt-get install wrk)"; exit 1; }

db=$(PG_EXTRA_OPTS="-c max_connections=200" ./scripts/pg-temp.sh start "$work/pg")
echo "bench-organizer-pw" | $BIN/crowdtrain-coordinator create-user --database-url "$db" \
  --username org --role organizer --password-stdin >/dev/null 2>&1
$BIN/crowdtrain-coordinator serve --database-url "$db" --listen 127.0.0.1:0 --data-dir "$work/coord" \
  --threads "$THREADS" --db-pool $((THREADS * 2)) --log-level warn >"$work/coord.log" 2>&1 &
pid=$!
i=0
while [ ! -s "$work/coord/coordinator.url" ]; do i=$((i + 1)); [ $i -gt 200 ] && { cat "$work/coord.log"; exit 1; }; sleep 0.1; done
url=$(cat "$work/coord/coordinator.url")
ca="$work/coord/tls-cert.pem"
login() { curl -sS --cacert "$ca" -d "{\"username\":\"$1\",\"password\":\"$2\"}" "$url/api/v1/session" | sed 's/.*"token":"\([^"]*\)".*/\1/'; }
org=$(login org bench-organizer-pw)
c() { curl -sS -o /dev/null --cacert "$ca" -H "Authorization: Bearer $org" -H 'Content-Type: application/json' "$@"; }
c -d '{"username":"vol","role":"volunteer","password":"bench-volunteer-pw"}' "$url/api/v1/users"
for r in 1 2 3 4 5 6 7 8; do
  c -d "{\"name\":\"run-$r\",\"target_batch_size\":4096,\"model_summary\":\"bench run $r\"}" "$url/api/v1/runs"
done
c -X PUT "$url/api/v1/runs/run-1/allowlist/vol"
vol=$(login vol bench-volunteer-pw)
# A signed pass request is accepted once, so wrk sends distinct ones signed
# just before (one key, fresh nonces; more than the run can use; the
# coordinator takes them for 300 s): thread k of the 2 sends lines k+1, k+3,
# ... A line sent twice would show as non-2xx (409 replayed_request).
cat >"$work/pass.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $vol"
local counter = 0
function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
end
local bodies, i = {}, 0
function init(args)
  for line in io.lines("$work/passreq.txt") do bodies[#bodies + 1] = line end
  i = id + 1 - 2
end
function request()
  i = i + 2
  if i > #bodies then i = id + 1 end
  return wrk.format(nil, nil, nil, bodies[i])
end
LUA

# run_wrk NAME PATH [SCRIPT] -> prints "NAME req/s p99"
run_wrk() {
  out=$(wrk -t2 -c"$CONNS" -d"${DUR}s" --timeout 5s --latency ${3:+-s "$3"} "$url$2" 2>&1)
  rps=$(echo "$out" | awk '/^Requests\/sec:/ {print $2}')
  p99=$(echo "$out" | awk '$1 == "99%" {print $2}')
  non2xx=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
  errs=$(echo "$out" | awk '/Socket errors/ {print}')
  printf '%-28s %10s req/s   p99 %8s   non-2xx %s %s\n' "$1" "$rps" "$p99" "${non2xx:-0}" "$errs"
  eval "${1}_rps=$rps"
}
echo "coordinator on loopback: $THREADS HTTP threads, $CONNS connections, ${DUR}s each, $(nproc) cores"
run_wrk reference_metrics /metrics
build/tests/bench/bench_passreq run-1 vol $((DUR * 8000)) >"$work/passreq.txt"
run_wrk passes /api/v1/runs/run-1/passes "$work/pass.lua"
run_wrk runs_list /api/v1/runs
issued=$(curl -sS --cacert "$ca" "$url/metrics" | awk '/^crowdtrain_passes_issued_total/ {print $2}')
echo "passes recorded by the coordinator: $issued"
awk -v p="$passes_rps" -v r="$runs_list_rps" -v m="$reference_metrics_rps" 'BEGIN {
  printf "passes/s vs goal 2000: %.2fx   reads/s vs goal 10000: %.2fx\n", p / 2000, r / 10000;
  printf "vs the no-database reference (/metrics): passes %.2f, reads %.2f\n", p / m, r / m }'

# Connection floods (issue 22): the same reads from 127.0.0.1 while
# tests/bench/bench_flood keeps connections open from other loopback
# addresses, reopening each one the server closes. idle: 100 addresses x 64
# connections that never send a byte (6,400, above the 4,096 cap: the
# coordinator evicts the oldest that showed no session); slow: 20 x 50 TLS
# connections that trickle one header line per second (the header deadline
# closes them). The flood client shares the machine's cores with the
# coordinator and PostgreSQL: part of any slowdown is that CPU.
port=${url##*:}
flood() { # NAME MODE NADDR PER
  build/tests/bench/bench_flood "$port" "$ca" "$2" "$3" "$4" $((DUR + 8)) >"$work/flood.out" 2>&1 &
  fpid=$!
  sleep 5 # let it reach full strength
  run_wrk "$1" /api/v1/runs
  wait "$fpid" || true
  sed 's/^/    /' "$work/flood.out"
}
flood flood_idle idle 100 64
flood flood_slow slow 20 50
closed=$(curl -sS --cacert "$ca" "$url/metrics" | awk '/^crowdtrain_connections_closed_total/ {printf "%s %s  ", $1, $2}')
echo "closed by the coordinator: $closed"
awk -v q="$runs_list_rps" -v i="$flood_idle_rps" -v s="$flood_slow_rps" 'BEGIN {
  printf "reads/s during a flood vs quiet: idle connections %.2f, slow headers %.2f\n", i / q, s / q }'
