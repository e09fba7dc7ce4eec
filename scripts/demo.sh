#!/bin/sh
# make demo: the main job on an embedded default. Today that is the access
# path of a collaborative run: a throwaway PostgreSQL, a coordinator with a
# self-signed certificate, an organizer who creates a run and allowlists a
# volunteer, and the volunteer's agent logging in and obtaining a signed
# access pass. Everything runs on loopback and is torn down at exit
# (CT_DEMO_KEEP=1 keeps it running until Ctrl-C).
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
api() { # api METHOD PATH [BODY] -- as the organizer
  curl -sS --fail-with-body --cacert "$ca" -X "$1" -H "Authorization: Bearer $tok" \
    -H 'Content-Type: application/json' ${3:+-d "$3"} "$url$2"
}
tok=""
tok=$(curl -sS --fail-with-body --cacert "$ca" -d '{"username":"organizer","password":"demo-organizer-pw"}' \
  "$url/api/v1/session" | sed 's/.*"token":"\([^"]*\)".*/\1/')

step "Organizer: create the run, a volunteer account, and allowlist the volunteer"
api POST /api/v1/runs '{"name":"fmnist-demo","target_batch_size":4096,"model_summary":"MLP 784-256-128-10 on Fashion-MNIST","description":"make demo"}'
echo
api POST /api/v1/users '{"username":"volunteer1","role":"volunteer","password":"demo-volunteer-pw"}'
echo
api PUT /api/v1/runs/fmnist-demo/allowlist/volunteer1
echo

step "Volunteer: crowdtrain-agent login --run fmnist-demo"
echo "demo-volunteer-pw" | $BIN/crowdtrain-agent login --coordinator "$url" --ca-cert "$ca" \
  --username volunteer1 --password-stdin --run fmnist-demo --config-dir "$work/agent"

step "Public view of the run, and the coordinator's published signing key"
curl -sS --cacert "$ca" "$url/api/v1/runs/fmnist-demo"; echo
curl -sS --cacert "$ca" "$url/api/v1/keys"; echo

step "Done: the agent holds a valid access pass (above)."
echo "Collaborative training joins this path once the peer-to-peer layer and the"
echo "training loop are wired into 'crowdtrain-agent join' (see README, Status)."
if [ "${CT_DEMO_KEEP:-0}" = 1 ]; then
  echo "CT_DEMO_KEEP=1: coordinator stays up at $url (CA $ca); Ctrl-C to stop."
  wait "$coord_pid"
fi
