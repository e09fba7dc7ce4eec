#!/bin/sh
# make test-packages: the Debian packages as a volunteer and an organizer
# get them. In a fresh Debian 12 root made by mmdebstrap (from the Debian
# archive, no container registry):
#   1. apt-get install ./crowdtrain-*.deb pulls every dependency into a
#      minimal system; the maintainer scripts made the user and directories;
#   2. systemd-analyze verify accepts both installed units;
#   3. the coordinator runs with exactly its unit's ExecStart line and user
#      (systemd cannot be PID 1 here; chroot + runuser instead) against a
#      throwaway PostgreSQL on the host's loopback (scripts/pg-temp.sh), and
#      serves the dashboard;
#   4. a volunteer logs in as the service's user (the consent the agent unit
#      waits for), and the agent runs with its unit's ExecStart line, user,
#      Nice= and CPUSchedulingPolicy= through a short Fashion-MNIST run to
#      completion, while `crowdtrain-agent status` reports it training, then
#      finished;
#   5. then the same root boots with systemd as PID 1 (systemd-nspawn -b,
#      host network): both services run from their units with all their
#      hardening (checked: NoNewPrivs, seccomp, nice 19, SCHED_BATCH), the
#      agent unit refuses to start without the volunteer's session
#      (ConditionPathExists), and with it trains a second run to completion.
#      Where systemd-nspawn cannot boot a container, this part says so and
#      is skipped (steps 1-4 still prove the rest).
#   scripts/test-packages.sh DEB-DIR       (root; installs mmdebstrap if missing)
# CT_PKGTEST_STEPS (default 20, more than the recipe's 10 warm-up steps) sets the run's length; CT_PKGTEST_KEEP=1
# keeps the root. Everything else is removed at exit.
set -eu
cd "$(dirname "$0")/.."
debs=$(cd "${1:?usage: $0 DEB-DIR}" && pwd)
[ "$(id -u)" -eq 0 ] || { echo "test-packages: needs root (mmdebstrap, chroot)" >&2; exit 1; }
# Our own mount namespace: the root's /proc and /dev mounts vanish with us.
if [ -z "${CT_PKGTEST_NS:-}" ]; then
  CT_PKGTEST_NS=1 exec unshare --mount --propagation private --fork -- "$0" "$@"
fi
set -- "$debs"/crowdtrain-agent_*.deb "$debs"/crowdtrain-coordinator_*.deb
[ -f "$1" ] && [ -f "$2" ] || { echo "test-packages: no crowdtrain-*.deb in $debs (make deb)" >&2; exit 1; }
for t in mmdebstrap:mmdebstrap systemd-nspawn:systemd-container; do
  command -v "${t%%:*}" >/dev/null || {
    echo "test-packages: installing ${t#*:}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${t#*:}" >/dev/null
  }
done

t0=$(date +%s)
work=$(mktemp -d /tmp/ct-pkgtest-XXXXXX)
chmod 755 "$work"
root=$work/root
coord_pid="" agent_pid="" boot_pid=""
cleanup() {
  rc=$?
  [ -n "$boot_pid" ] && kill -TERM "$boot_pid" 2>/dev/null && { timeout 30 tail --pid="$boot_pid" -f /dev/null || kill -KILL "$boot_pid"; } 2>/dev/null || true
  [ -n "$agent_pid" ] && kill -TERM "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null || true
  [ -n "$coord_pid" ] && kill -TERM "$coord_pid" 2>/dev/null && wait "$coord_pid" 2>/dev/null || true
  ./scripts/pg-temp.sh stop "$work/pg" || true
  umount -l "$root/dev" 2>/dev/null || true
  umount "$root/proc" 2>/dev/null || true
  if [ "${CT_PKGTEST_KEEP:-0}" = 1 ]; then echo "kept $work"; else rm -rf --one-file-system "$work"; fi
  exit $rc
}
trap cleanup EXIT INT TERM

step() { printf '\n== [%3ss] %s\n' "$(( $(date +%s) - t0 ))" "$*"; }
fail() { echo "test-packages: FAILED: $*" >&2; exit 1; }
inroot() { chroot "$root" "$@"; }

step "A fresh Debian 12 root (mmdebstrap --variant=apt bookworm)"
mmdebstrap --quiet --variant=apt bookworm "$root" \
  "deb http://deb.debian.org/debian bookworm main" \
  "deb http://deb.debian.org/debian bookworm-updates main" \
  "deb http://deb.debian.org/debian-security bookworm-security main"
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
cp /etc/resolv.conf "$root/etc/resolv.conf"
mkdir -p "$root/tmp/debs"
cp "$@" "$root/tmp/debs/"

step "apt-get install ./crowdtrain-agent_*.deb ./crowdtrain-coordinator_*.deb"
inroot sh -c 'cd /tmp/debs && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q ./crowdtrain-*.deb' \
  >"$work/apt.log" 2>&1 || { tail -n 30 "$work/apt.log"; fail "apt-get install"; }
grep -E '^(crowdtrain-(agent|coordinator)): ' "$work/apt.log" || true
for p in crowdtrain-agent crowdtrain-coordinator; do
  inroot dpkg-query -W -f='${Package} ${Version} ${Status}\n' "$p" | grep -q 'install ok installed' ||
    fail "$p is not installed"
done
inroot dpkg-query -W -f='${Version}\n' crowdtrain-agent
echo "pulled in: $(grep -c '^Setting up' "$work/apt.log") packages"
inroot getent passwd crowdtrain | grep -q '^crowdtrain:.*:/var/lib/crowdtrain:' || fail "no system user crowdtrain"
[ "$(inroot stat -c '%U %a' /var/lib/crowdtrain/agent)" = "crowdtrain 755" ] || fail "/var/lib/crowdtrain/agent"
[ "$(inroot stat -c '%U %a' /var/lib/crowdtrain/coordinator)" = "crowdtrain 700" ] || fail "/var/lib/crowdtrain/coordinator"
inroot dpkg-query --showformat='${Conffiles}\n' --show crowdtrain-agent crowdtrain-coordinator | grep -q /etc/crowdtrain/agent.conf ||
  fail "agent.conf is not a conffile"
[ -f "$root/usr/share/crowdtrain/web/index.html" ] || fail "no dashboard in the coordinator package"
# the user can run what the packages installed (no library missing)
inroot crowdtrain-agent --help >/dev/null || fail "crowdtrain-agent does not run"
inroot crowdtrain-coordinator serve --help >/dev/null || fail "crowdtrain-coordinator does not run"

step "systemd-analyze verify (systemd and the run's data installed as any Debian 12 has them)"
inroot sh -c 'DEBIAN_FRONTEND=noninteractive apt-get install -y -q systemd dataset-fashion-mnist' \
  >"$work/apt2.log" 2>&1 || { tail -n 30 "$work/apt2.log"; fail "apt-get install systemd"; }
units="/lib/systemd/system/crowdtrain-coordinator.service /lib/systemd/system/crowdtrain-agent.service"
# shellcheck disable=SC2086
out=$(inroot systemd-analyze verify $units 2>&1) || { echo "$out"; fail "systemd-analyze verify"; }
[ -z "$out" ] || { echo "$out"; fail "systemd-analyze verify said something"; }
echo "both units verified"

unit_key() { # UNIT KEY: the value of KEY= in the installed unit (one line)
  sed -n "s/^$2=//p" "$root/lib/systemd/system/$1.service" | tail -n 1
}

step "PostgreSQL (throwaway, on the host's loopback) and the coordinator's configuration"
db=$(./scripts/pg-temp.sh start "$work/pg")
echo "database: $db"
conf=$root/etc/crowdtrain/coordinator.conf
sed -i -e "s|^#database-url = .*|database-url = $db|" -e 's|^listen = .*|listen = 127.0.0.1:0|' "$conf"
# an ephemeral DHT backbone port: other tests may run on this machine
echo "dht-port = 0" >>"$conf"
grep -q "^database-url = $db" "$conf" || fail "could not set database-url"
echo "organizer-pw-123" | inroot runuser -u crowdtrain -- crowdtrain-coordinator create-user \
  --database-url "$db" --username organizer --role organizer --password-stdin >/dev/null

exec_coord=$(unit_key crowdtrain-coordinator ExecStart)
user=$(unit_key crowdtrain-coordinator User)
step "The coordinator, as its unit runs it: User=$user ExecStart=$exec_coord"
# shellcheck disable=SC2086
chroot "$root" runuser -u "$user" -- $exec_coord >"$work/coordinator.log" 2>&1 &
coord_pid=$!
urlf=$root/var/lib/crowdtrain/coordinator/coordinator.url
i=0
while [ ! -s "$urlf" ]; do
  i=$((i + 1)); [ $i -gt 300 ] && { cat "$work/coordinator.log"; fail "the coordinator did not start"; }
  kill -0 "$coord_pid" 2>/dev/null || { cat "$work/coordinator.log"; fail "the coordinator exited"; }
  sleep 0.1
done
url=$(cat "$urlf")
ca=$root/var/lib/crowdtrain/coordinator/tls-cert.pem
echo "coordinator: $url"
grep -q "dashboard files from /usr/share/crowdtrain/web" "$work/coordinator.log" ||
  { cat "$work/coordinator.log"; fail "the coordinator did not find the packaged dashboard"; }

step "The dashboard"
index=$(curl -sS --fail --cacert "$ca" "$url/")
echo "$index" | grep -q '<html' || fail "GET / is no HTML page"
js=$(echo "$index" | grep -o 'app/[A-Za-z0-9._-]*\.js' | head -n 1)
[ -n "$js" ] || fail "index.html names no script"
code=$(curl -sS -o /dev/null -w '%{http_code}' --cacert "$ca" "$url/$js")
[ "$code" = 200 ] || fail "GET /$js: $code"
echo "GET / and GET /$js: 200"

step "The organizer creates a $((${CT_PKGTEST_STEPS:-20}))-step Fashion-MNIST run and allowlists a volunteer"
tok=$(curl -sS --fail --cacert "$ca" -d '{"username":"organizer","password":"organizer-pw-123"}' \
  "$url/api/v1/session" | sed 's/.*"token":"\([^"]*\)".*/\1/')
api() { curl -sS --fail-with-body --cacert "$ca" -X "$1" -H "Authorization: Bearer $tok" \
          -H 'Content-Type: application/json' ${3:+-d "$3"} "$url$2"; }
ex=/usr/share/crowdtrain/examples
cfg=$(sed -e "s|\"fmnist-train.manifest.json\"|\"$ex/fmnist-train.manifest.json\"|" \
          -e "s|\"fmnist-test.manifest.json\"|\"$ex/fmnist-test.manifest.json\"|" \
          -e "s|\"steps\": [0-9]*|\"steps\": ${CT_PKGTEST_STEPS:-20}|" \
          -e 's|"device": "auto"|"device": "cpu"|' "$root$ex/fmnist-collab.json" | tr -d '\n')
api POST /api/v1/runs "{\"name\":\"pkgtest\",\"target_batch_size\":2048,\"model_summary\":\"MLP\",\"config\":$cfg}" >/dev/null
api POST /api/v1/users '{"username":"volunteer","role":"volunteer","password":"volunteer-pw-123"}' >/dev/null
api PUT /api/v1/runs/pkgtest/allowlist/volunteer >/dev/null

step "Consent: the volunteer logs in as the service's user"
cond=$(sed -n 's/^ConditionPathExists=//p' "$root/lib/systemd/system/crowdtrain-agent.service" | grep /var/lib)
[ ! -e "$root$cond" ] || fail "$cond exists before any login"
cp "$ca" "$root/etc/crowdtrain/coordinator-ca.pem"
echo "volunteer-pw-123" | inroot runuser -u crowdtrain -- crowdtrain-agent login \
  --config-dir /var/lib/crowdtrain/agent --coordinator "$url" --ca-cert /etc/crowdtrain/coordinator-ca.pem \
  --username volunteer --password-stdin --run pkgtest >"$work/login.log" 2>&1 ||
  { cat "$work/login.log"; fail "login"; }
[ -e "$root$cond" ] || fail "login did not write $cond (the agent unit's condition)"
echo "$cond written: the agent unit may start"
inroot crowdtrain-agent status --config-dir /var/lib/crowdtrain/agent >"$work/status0.txt" && fail "status before training said training"
grep -q "absent" "$work/status0.txt" || { cat "$work/status0.txt"; fail "status before training"; }
aconf=$root/etc/crowdtrain/agent.conf
sed -i 's|^#run = RUN|run = pkgtest|' "$aconf"
echo "listen-ip = 127.0.0.1" >>"$aconf"
grep -q '^run = pkgtest' "$aconf" || fail "could not set run"

exec_agent=$(unit_key crowdtrain-agent ExecStart)
user=$(unit_key crowdtrain-agent User)
nice=$(unit_key crowdtrain-agent Nice)
policy=$(unit_key crowdtrain-agent CPUSchedulingPolicy)
[ "$policy" = batch ] || fail "CPUSchedulingPolicy=$policy"
step "The agent, as its unit runs it: User=$user Nice=$nice CPUSchedulingPolicy=$policy ExecStart=$exec_agent"
# shellcheck disable=SC2086
chroot "$root" chrt --batch 0 nice -n "$nice" runuser -u "$user" -- $exec_agent >"$work/agent.log" 2>&1 &
agent_pid=$!
seen=0 i=0
while kill -0 "$agent_pid" 2>/dev/null; do
  i=$((i + 1)); [ $i -gt 1800 ] && { tail -n 20 "$work/agent.log"; fail "the run did not finish in 15 min"; }
  if [ "$seen" = 0 ] && inroot crowdtrain-agent status --config-dir /var/lib/crowdtrain/agent >"$work/status1.txt"; then
    seen=1
    cat "$work/status1.txt"
    grep -q "running (pid" "$work/status1.txt" && grep -q "run:       pkgtest" "$work/status1.txt" ||
      fail "status while training"
    # the process the status file names runs as the unit says
    pid=$(sed -n 's/^ *"pid": \([0-9]*\),*$/\1/p' "$root/var/lib/crowdtrain/agent/status.json")
    # (by uid: the host's names for the root's system uids differ)
    ps -o uid=,ni=,cls=,comm= -p "$pid" | tee "$work/ps.txt"
    [ "$(awk '{print $1, $2, $3}' "$work/ps.txt")" = "$(inroot id -u "$user") $nice B" ] ||
      fail "the agent does not run as $user at nice $nice with SCHED_BATCH"
  fi
  sleep 0.5
done
wait "$agent_pid" && arc=0 || arc=$?
agent_pid=""
tail -n 4 "$work/agent.log"
[ "$arc" -eq 0 ] || fail "the agent exited with $arc"
[ "$seen" = 1 ] || fail "crowdtrain-agent status never saw the agent training"
grep -q "evaluation at step ${CT_PKGTEST_STEPS:-20}" "$work/agent.log" || fail "no evaluation at the last step"
[ -s "$root/var/lib/crowdtrain/agent/pkgtest.safetensors" ] || fail "no exported model"
inroot crowdtrain-agent status --config-dir /var/lib/crowdtrain/agent >"$work/status2.txt" || true
cat "$work/status2.txt"
grep -q "state:     finished (exit status 0)" "$work/status2.txt" &&
  grep -q "step:      ${CT_PKGTEST_STEPS:-20} of ${CT_PKGTEST_STEPS:-20}" "$work/status2.txt" || fail "status after the run"

# runuser passes SIGTERM on to the coordinator, waits for it, then dies of
# the signal itself (143): its status says nothing about the coordinator's
kill -TERM "$coord_pid"
wait "$coord_pid" 2>/dev/null || true
coord_pid=""

step "Under systemd: the same root booted with systemd-nspawn -b"
umount -l "$root/dev"
umount "$root/proc"
rm -f "$urlf"
# the volunteer's session names the coordinator's URL: keep its port
sed -i "s|^listen = .*|listen = ${url#https://}|" "$conf"
systemd-nspawn --quiet -D "$root" -b --register=no --keep-unit --console=passive >"$work/boot.log" 2>&1 &
boot_pid=$!
init="" i=0
while [ -z "$init" ]; do
  i=$((i + 1))
  if [ $i -gt 100 ] || ! kill -0 "$boot_pid" 2>/dev/null; then
    cat "$work/boot.log"
    echo "test-packages: SKIPPED the systemd part: systemd-nspawn could not boot the root here"
    boot_pid=""
    step "Done (without systemd): packages installed, units verified, services ran as their units say ($(( $(date +%s) - t0 )) s)"
    exit 0
  fi
  init=$(pgrep -P "$boot_pid" -x systemd || true)
  sleep 0.1
done
insys() { nsenter -t "$init" -a "$@"; }
i=0
until st=$(insys systemctl is-system-running 2>/dev/null) && [ "$st" = running ] || [ "$st" = degraded ]; do
  i=$((i + 1)); [ $i -gt 300 ] && fail "systemd did not finish booting ($st)"
  sleep 0.1
done
echo "systemd in the root: $st"

insys systemctl start crowdtrain-coordinator
i=0
while [ ! -s "$urlf" ]; do
  i=$((i + 1)); [ $i -gt 300 ] && { insys journalctl -u crowdtrain-coordinator --no-pager | tail -n 20; fail "the coordinator unit did not start"; }
  sleep 0.1
done
url=$(cat "$urlf")
curl -sS --fail --cacert "$ca" "$url/" | grep -q '<html' || fail "the coordinator unit serves no dashboard"
echo "crowdtrain-coordinator.service: active, dashboard at $url/"
# hardening applied: no new privileges, a seccomp filter, not root
proc_check() { # UNIT NICE POLICY (0 normal, 3 batch): its main process as the unit says
  pid=$(insys systemctl show -p MainPID --value "$1")
  [ "$pid" -gt 0 ] || { insys journalctl -u "$1" --no-pager -o cat | tail -n 30; fail "$1 has no main process"; }
  got="$(insys stat -c %U "/proc/$pid") $(insys cat "/proc/$pid/stat" | awk '{print $19, $41}')"
  got="$got $(insys cat "/proc/$pid/status" | awk '/^(NoNewPrivs|Seccomp):/ {printf " %s", $2}')"
  echo "$1: user, nice, policy, NoNewPrivs, Seccomp: $got"
  [ "$got" = "crowdtrain $2 $3  1 2" ] || fail "$1 does not run as its unit says"
}
proc_check crowdtrain-coordinator 0 0

api POST /api/v1/runs "{\"name\":\"pkgtest2\",\"target_batch_size\":2048,\"model_summary\":\"MLP\",\"config\":$cfg}" >/dev/null
api PUT /api/v1/runs/pkgtest2/allowlist/volunteer >/dev/null
sed -i 's|^run = pkgtest$|run = pkgtest2|' "$aconf"
rm -f "$root/var/lib/crowdtrain/agent/status.json"

# no session, no agent: the unit's condition holds it back
mv "$root$cond" "$root$cond.away"
insys systemctl start crowdtrain-agent
[ "$(insys systemctl show -p ConditionResult --value crowdtrain-agent)" = no ] ||
  fail "the agent unit started without the volunteer's session"
echo "crowdtrain-agent.service without a session: not started (ConditionPathExists)"
mv "$root$cond.away" "$root$cond"

insys systemctl start crowdtrain-agent
i=0 seen=0
while :; do
  state=$(insys systemctl show -p ActiveState --value crowdtrain-agent)
  [ "$state" = active ] || [ "$state" = activating ] || break
  if [ "$seen" = 0 ] && [ -s "$root/var/lib/crowdtrain/agent/status.json" ]; then
    seen=1
    proc_check crowdtrain-agent 19 3
    insys crowdtrain-agent status | grep -q "run:       pkgtest2" || fail "status of the agent unit"
  fi
  i=$((i + 1)); [ $i -gt 1800 ] && fail "the agent unit did not finish in 15 min"
  sleep 0.5
done
insys journalctl -u crowdtrain-agent --no-pager -o cat | tail -n 4
[ "$(insys systemctl show -p Result --value crowdtrain-agent)" = success ] || fail "the agent unit ended with $(insys systemctl show -p Result --value crowdtrain-agent)"
[ "$seen" = 1 ] || fail "the agent unit wrote no status while it ran"
# a volunteer without root reads the service's status
insys runuser -u nobody -- crowdtrain-agent status >"$work/status3.txt" || true
cat "$work/status3.txt"
grep -q "state:     finished (exit status 0)" "$work/status3.txt" || fail "status of the finished agent unit (as nobody)"
insys systemctl stop crowdtrain-coordinator

step "Done: packages installed in a clean Debian 12, units verified, both services ran from their units under systemd and as their ExecStart lines say ($(( $(date +%s) - t0 )) s)"
