#!/bin/sh
# make demo: the main job on an embedded default. A throwaway PostgreSQL, a
# coordinator with a self-signed certificate, an organizer who creates the
# Fashion-MNIST run (examples/fmnist-collab.json) and allowlists four
# volunteers, and four local agents that log in and train the model
# together; it ends with their test accuracy and the exported model.
# Everything runs on loopback and is torn down at exit (CT_DEMO_KEEP=1
# keeps the coordinator up until Ctrl-C). CT_DEMO_AGENTS and CT_DEMO_STEPS
# change the number of agents (default 4) and steps (default the recipe's).
set -eu
cd "$(dirname "$0")/.."
BIN=build/bin
work=$(mktemp -d /tmp/crowdtrain-demo-XXXXXX)
chmod 755 "$work"
coord_pid=""
cleanup() {
  [ -n "$coord_pid" ] && kill -TERM "$coord_pid" 2>/dev/null && wait "$coord_pid" 2>/dev/null || true
  ./scripts/pg-temp.sh stop "$work/pg" || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

step() { printf '\n== %s\n' "$*"; }

step "Starting a throwaway PostgreSQL in $work/pg"
db=$(./scripts/pg-temp.sh start "$work/pg")
echo "database: $db"

step "Creating the first organizer account (crowdtrain-coordinator create-user)"
echo "demo-organizer-pw" | $BIN/crowdtrain-coordinator create-user --database-url "$db" \
  --username organizer --role organizer --password-stdin

step "Starting the coordinator (HTTPS, self-signed certificate in $work/coord)"
$BIN/crowdtrain-coordinator serve --database-url "$db" --listen 127.0.0.1:0 \
  --data-dir "$work/coord" --log-level warn >"$work/coordinator.log" 2>&1 &
coord_pid=$!
i=0
while [ ! -s "$work/coord/coordinator.url" ]; do
  i=$((i + 1)); [ $i -gt 200 ] && { cat "$work/coordinator.log"; exit 1; }
  sleep 0.1
done
url=$(cat "$work/coord/coordinator.url")
ca="$work/coord/tls-cert.pem"
echo "coordinator: $url"
echo "dashboard:   $url/ (live loss curve, peers, leaderboard; log in as organizer / demo-organizer-pw)"
api() { # api METHOD PATH [BODY] -- as the organizer
  curl -sS --fail-with-body --cacert "$ca" -X "$1" -H "Authorization: Bearer $tok" \
    -H 'Content-Type: application/json' ${3:+-d "$3"} "$url$2"
}
tok=""
tok=$(curl -sS --fail-with-body --cacert "$ca" -d '{"username":"organizer","password":"demo-organizer-pw"}' \
  "$url/api/v1/session" | sed 's/.*"token":"\([^"]*\)".*/\1/')

AGENTS=${CT_DEMO_AGENTS:-4}
ex=$(cd examples && pwd)
cfg=$(sed -e "s|\"fmnist-train.manifest.json\"|\"$ex/fmnist-train.manifest.json\"|" \
          -e "s|\"fmnist-test.manifest.json\"|\"$ex/fmnist-test.manifest.json\"|" \
          ${CT_DEMO_STEPS:+-e "s|\"steps\": [0-9]*|\"steps\": $CT_DEMO_STEPS|"} \
          examples/fmnist-collab.json | tr -d '\n')
step "Organizer: create the run (examples/fmnist-collab.json) and allowlist $AGENTS volunteers"
api POST /api/v1/runs "{\"name\":\"fmnist-demo\",\"target_batch_size\":2048,\"model_summary\":\"MLP 784-256-128-10 on Fashion-MNIST\",\"description\":\"make demo\",\"config\":$cfg}" >/dev/null
echo "run fmnist-demo: global batch 2048"
for i in $(seq 1 "$AGENTS"); do
  api POST /api/v1/users "{\"username\":\"volunteer$i\",\"role\":\"volunteer\",\"password\":\"demo-volunteer-pw\"}" >/dev/null
  api PUT "/api/v1/runs/fmnist-demo/allowlist/volunteer$i" >/dev/null
done
echo "volunteer1..volunteer$AGENTS allowlisted"

step "Volunteers: crowdtrain-agent login --run fmnist-demo (the first one's pass shown)"
for i in $(seq 1 "$AGENTS"); do
  if [ "$i" -eq 1 ]; then
    echo "demo-volunteer-pw" | $BIN/crowdtrain-agent login --coordinator "$url" --ca-cert "$ca" \
      --username volunteer1 --password-stdin --run fmnist-demo --config-dir "$work/agent1"
  else
    echo "demo-volunteer-pw" | $BIN/crowdtrain-agent login --coordinator "$url" --ca-cert "$ca" \
      --username "volunteer$i" --password-stdin --config-dir "$work/agent$i" >/dev/null
  fi
done

step "Training together: $AGENTS x crowdtrain-agent join --run fmnist-demo (agent 1 shown)"
pids=""
for i in $(seq 2 "$AGENTS"); do
  $BIN/crowdtrain-agent join --run fmnist-demo --config-dir "$work/agent$i" --listen-ip 127.0.0.1 \
    >"$work/agent$i.log" 2>&1 &
  pids="$pids $!"
done
# through tee, stdout is no terminal: ask for the live line anyway
$BIN/crowdtrain-agent join --run fmnist-demo --config-dir "$work/agent1" --listen-ip 127.0.0.1 \
  --progress live | tee "$work/agent1.log"
fail=0
for p in $pids; do wait "$p" || fail=1; done
[ "$fail" -eq 0 ] || { echo "an agent failed:"; tail -n 5 "$work"/agent*.log; exit 1; }
for i in $(seq 2 "$AGENTS"); do
  printf 'agent %s: %s\n' "$i" "$(grep -a 'evaluation at step' "$work/agent$i.log" | tail -n 1)"
done
# every agent applied the same averaged steps: their exports must be the same bytes
first=$(sha256sum "$work/agent1/fmnist-demo.safetensors" | cut -c1-64)
for i in $(seq 2 "$AGENTS"); do
  h=$(sha256sum "$work/agent$i/fmnist-demo.safetensors" | cut -c1-64)
  [ "$h" = "$first" ] || { echo "agent $i exported a different model ($h, agent 1: $first)"; exit 1; }
done
echo "the $AGENTS agents exported identical models (sha256 $(echo "$first" | cut -c1-16)...)"
mkdir -p build/demo
cp "$work/agent1/fmnist-demo.safetensors" build/demo/fmnist-demo.safetensors
echo "checkpoints on the coordinator:"
api GET /api/v1/runs/fmnist-demo/checkpoints; echo

step "Contributions the coordinator verified (signed reports of every round), and the learning curve's last points"
api GET "/api/v1/runs/fmnist-demo/contributions?format=csv&by=user"
curl -sS --cacert "$ca" "$url/api/v1/runs/fmnist-demo/curve?max_points=5"; echo

step "Public view of the run, and the coordinator's published signing key"
curl -sS --cacert "$ca" "$url/api/v1/runs/fmnist-demo"; echo
curl -sS --cacert "$ca" "$url/api/v1/keys"; echo

step "Done: the model the volunteers trained together is build/demo/fmnist-demo.safetensors"
if [ "${CT_DEMO_KEEP:-0}" = 1 ]; then
  echo "CT_DEMO_KEEP=1: coordinator and dashboard stay up at $url/ (CA $ca); Ctrl-C to stop."
  wait "$coord_pid"
fi
