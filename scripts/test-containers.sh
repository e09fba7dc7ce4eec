#!/bin/sh
# make test-containers: the container images built and run with podman,
# without any container registry (docker/README.md):
#   1. a Debian 12 base image from the Debian archive (docker/make-base.sh:
#      mmdebstrap | podman import), kept between runs as
#      localhost/crowdtrain-base:bookworm;
#   2. docker/Dockerfile.coordinator and docker/Dockerfile.agent built on it
#      from the .deb files of `make deb`, and a PostgreSQL 15 stand-in for
#      compose.yaml's postgres:15 (tests/containers/Dockerfile.postgres);
#   3. docker/compose.yaml agrees with the images (Dockerfiles, volumes,
#      ports, environment, read-only without capabilities);
#   4. compose.yaml's topology by hand (podman-compose is not needed): one
#      network, PostgreSQL as "db", the coordinator as "coordinator" with
#      the environment, volume and port compose gives it; the organizer is
#      created with `create-user` in a one-off container;
#   5. the image's healthcheck passes, the dashboard (GET / and its script)
#      loads from the coordinator container through its published port;
#   6. an organizer creates a short Fashion-MNIST run, a volunteer logs in
#      from a one-off agent container, and an agent container (the image's
#      default command, nice 19 and SCHED_BATCH, not root) trains it to
#      completion: `crowdtrain-agent status` in the container reports it
#      training, its healthcheck passes, it exits 0 after the last step's
#      evaluation, and the exported model is in its volume;
#   7. the coordinator stops cleanly on SIGTERM (podman stop).
#   scripts/test-containers.sh DEB-DIR     (root; installs podman, runc and
#                                           mmdebstrap if missing)
# Every container, image, volume and network it made is removed at exit,
# also on failure; the base image stays (made anew when older than a week,
# or with CT_CTRTEST_REBASE=1). About 1 min with the base kept, 1.5 min
# without, on 2 cores. The coordinator and the agent run read-only, without
# capabilities or new privileges, as compose.yaml runs them.
# CT_CTRTEST_STEPS (default 20) sets the run's length.
set -eu
cd "$(dirname "$0")/.."
debs=$(cd "${1:?usage: $0 DEB-DIR}" && pwd)
[ "$(id -u)" -eq 0 ] || { echo "test-containers: needs root (podman, mmdebstrap)" >&2; exit 1; }
set -- "$debs"/crowdtrain-agent_*.deb "$debs"/crowdtrain-coordinator_*.deb
[ -f "$1" ] && [ -f "$2" ] || { echo "test-containers: no crowdtrain-*.deb in $debs (make deb)" >&2; exit 1; }
for t in podman:podman runc:runc mmdebstrap:mmdebstrap python3:python3-yaml; do
  command -v "${t%%:*}" >/dev/null || {
    echo "test-containers: installing ${t#*:}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${t#*:}" >/dev/null
  }
done
python3 -c 'import yaml' 2>/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-yaml >/dev/null
data=/usr/share/datasets/fashion-mnist
[ -f "$data/train-images-idx3-ubyte.gz" ] ||
  { echo "test-containers: no Fashion-MNIST in $data (make deps: dataset-fashion-mnist)" >&2; exit 1; }

t0=$(date +%s)
work=$(mktemp -d /tmp/ct-ctrtest-XXXXXX)
chmod 755 "$work"
# The engine's settings for this test alone. runc: this machine's cgroups
# are hybrid (v1 controllers, an empty v2 tree), which crun refuses. The
# limits: podman would raise the open-file and process limits in the
# container above this process's, which only CAP_SYS_RESOURCE may do.
nofile=$(awk '/^Max open files/ {print $5}' /proc/self/limits)
[ "$nofile" = unlimited ] || [ "$nofile" -gt 16384 ] && nofile=16384
nproc=$(awk '/^Max processes/ {print $4}' /proc/self/limits)
[ "$nproc" = unlimited ] || [ "$nproc" -gt 8192 ] && nproc=8192
cat >"$work/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
EOF
export CONTAINERS_CONF="$work/containers.conf"

p=ctrtest-$$                      # names of everything this run makes
base=localhost/crowdtrain-base:bookworm
img_coord=localhost/crowdtrain-coordinator:$p
img_agent=localhost/crowdtrain-agent:$p
img_pg=localhost/crowdtrain-test-postgres:$p
net=$p
cleanup() {
  rc=$?
  if [ $rc -ne 0 ]; then
    for c in db coordinator agent; do
      podman container exists "$p-$c" 2>/dev/null || continue
      echo "--- podman logs $p-$c (last 30 lines)"
      podman logs "$p-$c" 2>&1 | tail -n 30
    done
  fi
  for c in agent coordinator db; do
    podman rm -f -t 5 "$p-$c" >/dev/null 2>&1 || true
  done
  podman ps -a -q --filter "label=ct-ctrtest=$p" | xargs -r podman rm -f >/dev/null 2>&1 || true
  podman volume ls -q --filter "label=ct-ctrtest=$p" | xargs -r podman volume rm -f >/dev/null 2>&1 || true
  podman network rm -f "$net" >/dev/null 2>&1 || true
  podman rmi -f "$img_coord" "$img_agent" "$img_pg" >/dev/null 2>&1 || true
  podman image prune -f --filter "label=ct-ctrtest=$p" >/dev/null 2>&1 || true
  rm -rf "$work"
  exit $rc
}
trap cleanup EXIT INT TERM

step() { printf '\n== [%3ss] %s\n' "$(( $(date +%s) - t0 ))" "$*"; }
fail() { echo "test-containers: FAILED: $*" >&2; exit 1; }
# one-off containers, labelled for the cleanup; podman's healthcheck timers
# need systemd, so every container here runs without them (healthy() below)
prun() { podman run --rm --label "ct-ctrtest=$p" --no-healthcheck "$@"; }
# healthy NAME SECONDS: the image's own HEALTHCHECK passes within SECONDS
# (run on demand: podman schedules it with systemd timers, absent here)
healthy() {
  i=0
  until podman healthcheck run "$1" >/dev/null 2>&1; do
    i=$((i + 1)); [ $i -gt $(($2 * 2)) ] && return 1
    podman container exists "$1" && [ "$(podman inspect -f '{{.State.Running}}' "$1")" = true ] || return 1
    sleep 0.5
  done
}

# a base older than a week is made anew (a week of Debian's security
# updates)
age=$(( $(date +%s) - $(podman image inspect -f '{{.Created.Unix}}' "$base" 2>/dev/null || echo 0) ))
if [ "${CT_CTRTEST_REBASE:-0}" = 1 ] || [ "$age" -gt 604800 ]; then
  step "The base image $base from the Debian archive (docker/make-base.sh: mmdebstrap | podman import)"
  old=$(podman image inspect -f '{{.Id}}' "$base" 2>/dev/null || true)
  CT_ENGINE=podman ./docker/make-base.sh "$base" 2>&1 | grep -v -e '^Copying' -e '^Getting' -e '^Writing' -e '^Storing' || true
  podman image exists "$base" || fail "docker/make-base.sh made no $base"
  # the one it replaces, now untagged
  [ -z "$old" ] || [ "$old" = "$(podman image inspect -f '{{.Id}}' "$base")" ] || podman rmi "$old" >/dev/null 2>&1 || true
else
  step "The base image $base (kept from an earlier run, made $(podman image inspect -f '{{.Created}}' "$base" | cut -c1-19))"
fi
prun "$base" cat /etc/debian_version

build() { # IMAGE DOCKERFILE CONTEXT
  s=$(date +%s)
  podman build -q --format docker --label "ct-ctrtest=$p" --build-arg "BASE=$base" \
    -f "$2" -t "$1" "$3" >"$work/build.log" 2>&1 || { tail -n 30 "$work/build.log"; fail "podman build -f $2"; }
  echo "$1: built in $(( $(date +%s) - s )) s, $(podman image inspect -f '{{.Size}}' "$1" | awk '{printf "%.0f MB", $1 / 1e6}')"
}
step "podman build: the coordinator and agent images from $(basename "$2") and $(basename "$1")"
build "$img_coord" docker/Dockerfile.coordinator "$debs"
build "$img_agent" docker/Dockerfile.agent "$debs"
build "$img_pg" tests/containers/Dockerfile.postgres tests/containers
for i in "$img_coord" "$img_agent"; do
  [ "$(podman image inspect -f '{{.Config.User}}' "$i")" = 990:990 ] || fail "$i does not run as the crowdtrain user"
  podman image inspect -f '{{json .Config.Volumes}}' "$i" | grep -q /var/lib/crowdtrain/ || fail "$i declares no state volume"
  podman image inspect -f '{{json .HealthCheck}}' "$i" | grep -q CMD || fail "$i has no healthcheck"
done
prun --entrypoint sh "$img_coord" -c \
  'for c in gcc cc make; do command -v $c && exit 1; done; test -f /usr/share/crowdtrain/web/index.html' ||
  fail "the coordinator image has a compiler, or no dashboard"

step "compose.yaml agrees with the images"
compose_get() { # SERVICE FIELD -> one line per item
  python3 - "$1" "$2" <<'EOF'
import sys, yaml
s = yaml.safe_load(open("docker/compose.yaml"))["services"][sys.argv[1]]
v = s.get(sys.argv[2], [])
for x in (v.items() if isinstance(v, dict) else v):
    print("%s=%s" % x if isinstance(x, tuple) else x if isinstance(x, str) else yaml.safe_dump(x).strip())
EOF
}
for svc in coordinator:"$img_coord" agent:"$img_agent"; do
  s=${svc%%:*} i=${svc#*:}
  df=$(python3 -c 'import sys, yaml, os; b = yaml.safe_load(open("docker/compose.yaml"))["services"][sys.argv[1]]["build"]; print(os.path.normpath(os.path.join("docker", b["context"], b["dockerfile"])))' "$s")
  [ "$df" = "docker/Dockerfile.$s" ] || fail "compose.yaml builds $s from $df"
  vols=$(podman image inspect -f '{{json .Config.Volumes}}' "$i")
  for v in $(compose_get "$s" volumes | sed -n 's/^[A-Za-z0-9][A-Za-z0-9_.-]*:\([^:]*\).*/\1/p'); do
    echo "$vols" | grep -q "\"$v\"" || fail "compose.yaml mounts a volume on $v, which $i does not declare ($vols)"
    echo "compose $s: volume on $v (declared by the image)"
  done
  for port in $(compose_get "$s" ports | sed -n 's/.*:\([0-9-]*\)$/\1/p'); do
    podman image inspect -f '{{json .Config.ExposedPorts}}' "$i" | grep -q -e "\"$port/tcp\"" -e "\"${port%%-*}/tcp\"" ||
      fail "compose.yaml publishes $port of $s, which $i does not expose"
    echo "compose $s: port $port (exposed by the image)"
  done
done
for s in coordinator agent; do
  python3 - "$s" <<'EOF' || fail "compose.yaml runs $s otherwise than this test (read-only, no capabilities)"
import sys, yaml
s = yaml.safe_load(open("docker/compose.yaml"))["services"][sys.argv[1]]
sys.exit(not (s.get("read_only") is True and s.get("cap_drop") == ["ALL"]
              and "no-new-privileges:true" in s.get("security_opt", [])))
EOF
done
compose_get coordinator environment >"$work/compose-coord.env"
# shellcheck disable=SC2016 # compose.yaml's text, unexpanded
grep -q '^CROWDTRAIN_DATABASE_URL=postgresql://crowdtrain:${CROWDTRAIN_DB_PASSWORD}@db:5432/crowdtrain$' "$work/compose-coord.env" ||
  fail "compose.yaml's database URL is not the one this test uses"
# shellcheck disable=SC2016
grep -q '^CROWDTRAIN_PUBLIC_URL=${CROWDTRAIN_PUBLIC_URL:-https://coordinator:8443}$' "$work/compose-coord.env" ||
  fail "compose.yaml's public URL is not the one this test uses"

step "PostgreSQL (as compose.yaml's db) and the first organizer (create-user in a one-off coordinator container)"
pw=ctrtest-db-pw-$$
podman network create --label "ct-ctrtest=$p" "$net" >/dev/null 2>"$work/network.log" ||
  { cat "$work/network.log"; fail "podman network create"; }
vol() { podman volume create --label "ct-ctrtest=$p" "$p-$1" >/dev/null; echo "$p-$1"; }
# start NAME ARGS...: a long-running container of this test (podman's
# complaints about the missing systemd timers kept out of the output)
start() {
  n=$1; shift
  podman run -d --name "$p-$n" --health-interval disable "$@" >/dev/null 2>"$work/start-$n.log" ||
    { cat "$work/start-$n.log"; fail "podman run $n"; }
}
# the images' state is all in their volumes: they run read-only (no tmpfs
# either, as docker runs read_only), without
# capabilities or new privileges (compose.yaml runs them so too)
hardened="--read-only --read-only-tmpfs=false --cap-drop ALL --security-opt no-new-privileges"
start db --network "$net" --network-alias db \
  -e POSTGRES_USER=crowdtrain -e POSTGRES_PASSWORD="$pw" -e POSTGRES_DB=crowdtrain \
  -v "$(vol db)":/var/lib/postgresql/data "$img_pg" >/dev/null
healthy "$p-db" 60 || fail "PostgreSQL did not become ready"
db_url="postgresql://crowdtrain:$pw@db:5432/crowdtrain"
# shellcheck disable=SC2086
echo "organizer-pw-123" | prun -i --network "$net" $hardened \
  -e CROWDTRAIN_DATABASE_URL="$db_url" "$img_coord" \
  create-user --username organizer --role organizer --password-stdin >"$work/create-user.log" 2>&1 ||
  { cat "$work/create-user.log"; fail "create-user in a coordinator container"; }
grep "database schema at version" "$work/create-user.log"

step "The coordinator container (its image's command, compose.yaml's environment, volume and port)"
# shellcheck disable=SC2086
start coordinator --network "$net" --network-alias coordinator $hardened \
  -e CROWDTRAIN_DATABASE_URL="$db_url" -e CROWDTRAIN_PUBLIC_URL=https://coordinator:8443 \
  -v "$(vol coordinator)":/var/lib/crowdtrain/coordinator -p 127.0.0.1::8443 "$img_coord"
healthy "$p-coordinator" 60 || fail "the coordinator's healthcheck did not pass"
echo "healthcheck: healthy"
podman logs "$p-coordinator" 2>&1 | grep -q "dashboard files from /usr/share/crowdtrain/web" ||
  fail "the coordinator did not find the packaged dashboard"
[ "$(podman top "$p-coordinator" huser | tail -n 1)" = 990 ] || fail "the coordinator does not run as uid 990"
hostport=$(podman port "$p-coordinator" 8443/tcp | head -n 1)
url=https://$hostport
podman cp "$p-coordinator:/var/lib/crowdtrain/coordinator/tls-cert.pem" "$work/ca.pem"
chmod 644 "$work/ca.pem"
echo "coordinator: https://coordinator:8443 in the network, $url on the host"

step "The dashboard from the coordinator container"
index=$(curl -sS --fail --cacert "$work/ca.pem" "$url/")
echo "$index" | grep -q '<html' || fail "GET / is no HTML page"
js=$(echo "$index" | grep -o 'app/[A-Za-z0-9._-]*\.js' | head -n 1)
[ -n "$js" ] || fail "index.html names no script"
code=$(curl -sS -o "$work/app.js" -w '%{http_code} %{content_type}' --cacert "$work/ca.pem" "$url/$js")
case $code in "200 "*javascript*) ;; *) fail "GET /$js: $code" ;; esac
[ "$(stat -c %s "$work/app.js")" -gt 1000 ] || fail "GET /$js: a short script"
echo "GET / and GET /$js ($(stat -c %s "$work/app.js") bytes): 200"

steps=${CT_CTRTEST_STEPS:-20}
step "The organizer creates a $steps-step Fashion-MNIST run and allowlists a volunteer"
tok=$(curl -sS --fail --cacert "$work/ca.pem" -d '{"username":"organizer","password":"organizer-pw-123"}' \
  "$url/api/v1/session" | sed 's/.*"token":"\([^"]*\)".*/\1/')
api() { curl -sS --fail-with-body --cacert "$work/ca.pem" -X "$1" -H "Authorization: Bearer $tok" \
          -H 'Content-Type: application/json' ${3:+-d "$3"} "$url$2"; }
ex=/usr/share/crowdtrain/examples   # in the agent image
cfg=$(sed -e "s|\"fmnist-train.manifest.json\"|\"$ex/fmnist-train.manifest.json\"|" \
          -e "s|\"fmnist-test.manifest.json\"|\"$ex/fmnist-test.manifest.json\"|" \
          -e "s|\"steps\": [0-9]*|\"steps\": $steps|" \
          -e 's|"device": "auto"|"device": "cpu"|' examples/fmnist-collab.json | tr -d '\n')
api POST /api/v1/runs "{\"name\":\"ctrtest\",\"target_batch_size\":2048,\"model_summary\":\"MLP\",\"config\":$cfg}" >/dev/null
api POST /api/v1/users '{"username":"volunteer","role":"volunteer","password":"volunteer-pw-123"}' >/dev/null
api PUT /api/v1/runs/ctrtest/allowlist/volunteer >/dev/null

step "The volunteer logs in from a one-off agent container (the consent)"
avol=$(vol agent)
# the coordinator's self-signed certificate, where the session will look for it
ca_mount="$work/ca.pem:/etc/crowdtrain/coordinator-ca.pem:ro"
# shellcheck disable=SC2086
echo "volunteer-pw-123" | prun -i --network "$net" $hardened \
  -v "$avol":/var/lib/crowdtrain/agent -v "$ca_mount" "$img_agent" \
  login --coordinator https://coordinator:8443 --ca-cert /etc/crowdtrain/coordinator-ca.pem \
  --username volunteer --password-stdin --run ctrtest >"$work/login.log" 2>&1 ||
  { cat "$work/login.log"; fail "login"; }
echo "logged in: session in volume $avol"

step "The agent container trains the run (its image's default command)"
# shellcheck disable=SC2086
start agent --network "$net" $hardened \
  -e CROWDTRAIN_RUN=ctrtest -v "$avol":/var/lib/crowdtrain/agent -v "$ca_mount" \
  -v "$data:$data:ro" "$img_agent"
seen=0 i=0
while [ "$(podman inspect -f '{{.State.Running}}' "$p-agent")" = true ]; do
  i=$((i + 1)); [ $i -gt 1800 ] && fail "the run did not finish in 15 min"
  if [ "$seen" = 0 ] && podman exec "$p-agent" crowdtrain-agent status >"$work/status1.txt" 2>&1; then
    seen=1
    cat "$work/status1.txt"
    grep -q "running (pid 1," "$work/status1.txt" && grep -q "run:       ctrtest" "$work/status1.txt" ||
      fail "status while training"
    podman healthcheck run "$p-agent" >/dev/null || fail "the agent's healthcheck failed while it trained"
    echo "healthcheck: healthy"
    # pid 1 of the container: the agent itself (chrt and nice exec it)
    ps -o uid=,ni=,cls=,comm= -p "$(podman inspect -f '{{.State.Pid}}' "$p-agent")" | tee "$work/ps.txt"
    [ "$(awk '{print $1, $2, $3, $4}' "$work/ps.txt")" = "990 19 B crowdtrain-agen" ] ||
      fail "the agent does not run as uid 990 at nice 19 with SCHED_BATCH"
  fi
  sleep 0.5
done
arc=$(podman inspect -f '{{.State.ExitCode}}' "$p-agent")
podman logs "$p-agent" >"$work/agent.log" 2>&1
tail -n 4 "$work/agent.log"
[ "$arc" -eq 0 ] || fail "the agent exited with $arc"
[ "$seen" = 1 ] || fail "crowdtrain-agent status never saw the agent training"
grep -q "evaluation at step $steps" "$work/agent.log" || fail "no evaluation at the last step"
# a one-off container reads the volume (--init: pid 1 is not an agent there)
prun --init -v "$avol":/var/lib/crowdtrain/agent "$img_agent" status \
  >"$work/status2.txt" || true
cat "$work/status2.txt"
grep -q "state:     finished (exit status 0)" "$work/status2.txt" &&
  grep -q "step:      $steps of $steps" "$work/status2.txt" || fail "status after the run"
prun -v "$avol":/var/lib/crowdtrain/agent --entrypoint stat "$img_agent" \
  -c '%s bytes, owner %u' /var/lib/crowdtrain/agent/ctrtest.safetensors >"$work/model.txt" || fail "no exported model"
echo "exported model: $(cat "$work/model.txt")"
grep -q ' owner 990$' "$work/model.txt" || fail "the exported model's owner"

step "The coordinator stops cleanly on SIGTERM (podman stop)"
podman stop -t 30 "$p-coordinator" >/dev/null 2>&1
crc=$(podman inspect -f '{{.State.ExitCode}}' "$p-coordinator")
[ "$crc" -eq 0 ] || fail "the coordinator exited with $crc on SIGTERM"
podman logs "$p-coordinator" 2>&1 | tail -n 1 | grep -q stopped || fail "the coordinator did not log its stop"

step "Done: both images built on a registry-free Debian 12 base, PostgreSQL + coordinator + a CPU agent trained $steps steps, dashboard served ($(( $(date +%s) - t0 )) s)"
