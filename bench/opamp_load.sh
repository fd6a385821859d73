#!/usr/bin/env bash
# opamp_load.sh — sizing note for an OpAMP server managing a Petrel fleet
# (issue 45): N simulated agents (bench/opamp_load/, opamp-go's own client
# v0.23.0: describe, report health, answer remote configs APPLIED) against
# the test suite's server (opamp-go's server v0.23.0 with the control API
# of crates/petrel/tests/opamp_server/, recording off), on loopback. One
# remote configuration is pushed to every agent midway. Prints the server's
# CPU (every thread's schedstat over the window), its peak and final RSS,
# and the load tool's own CPU. Both stop by themselves.
#
#   bench/opamp_load.sh [AGENTS] [WINDOW_SECS]      default 1000 agents, 60 s
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
. "$root/scripts/lib/cache.sh"
agents=${1:-1000}
window=${2:-60}
src="$root/bench/opamp_load"
if ! cache_begin opamp-load v0.23.0 "$0" "$src/go.mod" "$src/go.sum" "$src/main.go"; then
  cache_go_env
  (cd "$src" && go build -trimpath -o "$CACHE_ENTRY/opampload" .)
  cache_done
fi
load_bin="$CACHE_ENTRY/opampload"
server_bin=$("$root/scripts/opamp-server.sh" | tail -n 1)
work=$(mktemp -d /tmp/petrel-opamp-load-XXXXXX)
trap 'kill $srv $load 2>/dev/null || true; rm -rf "$work"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
control=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$server_bin" -addr "127.0.0.1:$port" -control "127.0.0.1:$control" -lifetime 30m -record=false >"$work/server.log" 2>&1 &
srv=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$control/control/agents" >/dev/null && break; sleep 0.1; done
cpu_ns() { # PID: every thread's time on CPU, ns
  local t sum=0
  for t in /proc/"$1"/task/*/schedstat; do read -r n _ <"$t" 2>/dev/null && sum=$((sum + n)); done
  echo "$sum"
}
ramp=$((agents / 100 + 5))
"$load_bin" -url "ws://127.0.0.1:$port/v1/opamp" -agents "$agents" -ramp "${ramp}s" \
  -duration "$((window + 10))s" >"$work/load.out" 2>"$work/load.log" &
load=$!
sleep $((ramp + 5))
connected=$(curl -sf "http://127.0.0.1:$control/control/agents" | python3 -c 'import json,sys; print(json.load(sys.stdin)["websocket"])')
s0=$(cpu_ns $srv); l0=$(cpu_ns $load); t0=$(date +%s.%N)
peak=0
for i in $(seq "$window"); do
  if ((i == window / 2)); then
    # One remote configuration (three pipeline files) pushed to every agent.
    curl -sf -X POST "http://127.0.0.1:$control/control/config" \
      -d '{"files":{"a.yaml":"sources: []\n","b.yaml":"sources: []\n","c.yaml":"sources: []\n"}}' >/dev/null
  fi
  r=$(awk '/VmRSS/ {print $2}' /proc/$srv/status); ((r > peak)) && peak=$r
  sleep 1
done
s1=$(cpu_ns $srv); l1=$(cpu_ns $load); t1=$(date +%s.%N)
final=$(awk '/VmRSS/ {print $2}' /proc/$srv/status)
wait $load || true
python3 - "$agents" "$connected" "$s0" "$s1" "$l0" "$l1" "$t0" "$t1" "$peak" "$final" "$work/load.out" <<'PY'
import json, sys
agents, connected, s0, s1, l0, l1 = map(int, sys.argv[1:7])
t0, t1 = float(sys.argv[7]), float(sys.argv[8])
peak, final = int(sys.argv[9]) / 1024, int(sys.argv[10]) / 1024
try:
    out = json.load(open(sys.argv[11]))
except (OSError, ValueError):
    out = {}
wall = t1 - t0
print(f"{agents} simulated agents (heartbeat 30 s), {connected} connected at the start of the {wall:.0f} s window; "
      f"one remote configuration pushed to all midway, applied by {out.get('configs_applied', '?')}")
print()
print("| process | CPU, cores | RSS MB |")
print("|---|---:|---:|")
print(f"| OpAMP server (opamp-go v0.23.0 + the test control API) | {(s1 - s0) / 1e9 / wall:.3f} (target < 1) | {peak:.1f} peak, {final:.1f} at the end |")
print(f"| the load tool ({agents} opamp-go clients) | {(l1 - l0) / 1e9 / wall:.3f} | |")
PY
