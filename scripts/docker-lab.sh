#!/usr/bin/env bash
# docker-lab.sh — a private Docker daemon (Debian's docker.io) for tests; no registry, no network setup.
#
#   docker-lab.sh setup    apt-get install docker.io busybox-static (no system dockerd or containerd is started).
#   docker-lab.sh start    start dockerd with its own data root, exec root, socket, containerd namespace and cgroup
#                          parent under $DOCKERLAB_DIR, no bridge and no iptables; import a busybox image
#                          (localhost/dockerlab/busybox:1, from the busybox-static binary); prints the socket path.
#   docker-lab.sh stop     remove every container, stop dockerd (and its containerd), kill leftover shims by PID,
#                          unmount, remove the cgroups and the data root. Keeps nothing but dockerd.log.
#   docker-lab.sh docker ARGS...   the docker CLI against this daemon.
#
# Env: DOCKERLAB_DIR (default <repo>/.cache/dockerlab), DOCKERLAB_NICE (default 10). Several labs can run at once
# with different DOCKERLAB_DIR (the namespace and cgroup parent are derived from its name).
# Containers log with the json-file driver: $DOCKERLAB_DIR/root/containers/<id>/<id>-json.log.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
L=${DOCKERLAB_DIR:-$REPO/.cache/dockerlab}
NICE=${DOCKERLAB_NICE:-10}
NAME=dockerlab-$(basename "$L" | tr -c 'a-zA-Z0-9_\n-' '-')
SOCK=$L/docker.sock
PIDFILE=$L/dockerd.pid
IMAGE=localhost/dockerlab/busybox:1
DOCKER=/usr/bin/docker   # the distribution's CLI, whatever else is on PATH

log() { echo "docker-lab: $*" >&2; }
die() { echo "docker-lab: error: $*" >&2; exit 1; }
docker_() { "$DOCKER" -H "unix://$SOCK" "$@"; }

dockerd_pid() {
  local p
  [ -f "$PIDFILE" ] || return 1
  p=$(cat "$PIDFILE")
  [ -n "$p" ] && [ -d "/proc/$p" ] && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = dockerd ] || return 1
  echo "$p"
}

cmd_setup() {
  local missing=() p
  for p in docker.io busybox-static; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  local prc=/usr/sbin/policy-rc.d created=0
  if [ ! -e $prc ]; then printf '#!/bin/sh\nexit 101\n' > $prc; chmod +x $prc; created=1; fi
  DEBIAN_FRONTEND=noninteractive nice -n "$NICE" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  [ $created = 1 ] && rm -f $prc
  return 0
}

cmd_start() {
  command -v dockerd >/dev/null && [ -x "$DOCKER" ] || die "run '$0 setup' first"
  mkdir -p "$L"
  if ! dockerd_pid >/dev/null; then
    rm -f "$SOCK"
    nohup nice -n "$NICE" dockerd --data-root "$L/root" --exec-root "$L/exec" --pidfile "$PIDFILE" \
      -H "unix://$SOCK" --iptables=false --ip6tables=false --bridge=none --storage-driver=overlay2 \
      --containerd-namespace "$NAME" --containerd-plugins-namespace "$NAME-plugins" \
      --cgroup-parent "/$NAME" --log-driver json-file >>"$L/dockerd.log" 2>&1 </dev/null &
    local i
    for i in $(seq 1 120); do
      docker_ version >/dev/null 2>&1 && break
      sleep 0.5
    done
    docker_ version >/dev/null 2>&1 || die "dockerd not ready after 60 s; see $L/dockerd.log"
    log "dockerd pid $(cat "$PIDFILE"), log $L/dockerd.log"
  fi
  if ! docker_ image inspect "$IMAGE" >/dev/null 2>&1; then
    local r=$L/rootfs a
    rm -rf "$r"; mkdir -p "$r"/{bin,etc,tmp,proc,sys,dev,root}
    cp /bin/busybox "$r/bin/busybox"
    for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -sf busybox "$r/bin/$a"; done
    echo 'root:x:0:0:root:/root:/bin/sh' > "$r/etc/passwd"; echo 'root:x:0:' > "$r/etc/group"
    tar -C "$r" -c . | docker_ import -c 'ENV PATH=/bin' -c 'CMD ["/bin/sh"]' - "$IMAGE" >/dev/null
    rm -rf "$r"
  fi
  echo "$SOCK"
}

cmd_stop() {
  local p
  if dockerd_pid >/dev/null && docker_ version >/dev/null 2>&1; then
    p=$(docker_ ps -aq)
    [ -n "$p" ] && docker_ rm -f $p >/dev/null 2>&1 || true
  fi
  if p=$(dockerd_pid); then
    kill -TERM "$p"
    for _ in $(seq 1 60); do [ -d "/proc/$p" ] || break; sleep 0.25; done
    [ -d "/proc/$p" ] && kill -KILL "$p"
  fi
  rm -f "$PIDFILE"
  # containerd and shims of this daemon (dockerd normally stops them): by PID, matched on our namespace/dir
  local d
  for d in /proc/[0-9]*; do
    { tr '\0' ' ' < "$d/cmdline"; } 2>/dev/null | grep -Eq "(containerd-shim.* -namespace $NAME |containerd --config $L/)" &&
      kill -KILL "${d#/proc/}" 2>/dev/null
  done
  awk -v L="$L/" 'index($5, L) == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
  for p in /sys/fs/cgroup/*/"$NAME" /sys/fs/cgroup/"$NAME"; do
    [ -d "$p" ] && find "$p" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  rm -rf "$L/root" "$L/exec" "$L/rootfs" "$SOCK"
  log "stopped"
}

case "${1:-}" in
  setup) cmd_setup ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  docker) shift; docker_ "$@" ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
