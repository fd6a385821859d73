#!/usr/bin/env bash
# docker-lab.sh — a private Docker daemon (Debian's docker.io) writing real json-file logs;
# no registry, no network, nothing shared with a system Docker or containerd.
#
#   docker-lab.sh setup           apt-get install docker.io busybox-static (a policy-rc.d answering 101
#                                 keeps apt from starting a system daemon); build a busybox rootfs tarball
#                                 from /bin/busybox. Cached under $DOCKERLAB_DIR; idempotent.
#   docker-lab.sh start           start dockerd (own --data-root, --exec-root, --pidfile, unix socket under
#                                 $DOCKERLAB_DIR; its own managed containerd; no iptables, no bridge, cgroup
#                                 parent /petrel-docker-lab), import the busybox image; prints the socket.
#   docker-lab.sh run NAME CMD... run a container NAME (network none, json-file log driver) running CMD...;
#                                 prints its log file  $DOCKERLAB_DIR/root/containers/<id>/<id>-json.log.
#                                 Env: DOCKERLAB_LABELS="k=v,k2=v2" (container labels), DOCKERLAB_WAIT=1
#                                 (return once it exited; at most DOCKERLAB_TIMEOUT s, default 60),
#                                 DOCKERLAB_RUN_ARGS (more `docker run` arguments, e.g. "-v /x:/x:ro").
#   docker-lab.sh stop            remove every container, stop dockerd and its containerd (by PID, bounded
#                                 waits, then SIGKILL), kill leftover shims by PID, unmount what is mounted
#                                 under $DOCKERLAB_DIR, remove the cgroups, the data and exec roots (the log
#                                 files go with them: copy what you need first). Keeps the image tarball.
#   docker-lab.sh clean           stop, then rm -rf $DOCKERLAB_DIR.
#   docker-lab.sh docker ARGS...  the docker CLI against this daemon.
#
# Docker 20.10 json-file, as this daemon writes it (see crates/petrel/tests/data/docker/README.md):
# one {"log","stream","time"} object per line; a line longer than 16 KiB is cut into 16384-byte
# records whose "log" has no trailing "\n", the last one carrying it (a line of exactly 16384 bytes
# gives a full record and then a record of just "\n"); every record of a chain has the chain's first
# timestamp; stderr records can fall between the records of a stdout chain.
set -euo pipefail

L=${DOCKERLAB_DIR:-/tmp/petrel-docker-lab}
IMAGE=petrel-lab/busybox:1
SOCK=$L/docker.sock
PIDFILE=$L/dockerd.pid
CGROUP=petrel-docker-lab
DOCKER=/usr/bin/docker # Debian's CLI, matching the daemon (not another one earlier in PATH)

log() { echo "docker-lab: $*" >&2; }
die() {
    echo "docker-lab: error: $*" >&2
    exit 1
}
dk() { "$DOCKER" -H "unix://$SOCK" "$@"; }

dockerd_pid() {
    local p
    [ -f "$PIDFILE" ] || return 1
    p=$(cat "$PIDFILE")
    [ -n "$p" ] && [ -d "/proc/$p" ] && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = dockerd ] || return 1
    echo "$p"
}

# PIDs of dockerd's own containerd and of shims whose command line names this lab's directory
# (never any other process: a test reading $L's logs must survive a stop).
lab_pids() {
    local d
    for d in /proc/[0-9]*; do
        case "$(cat "$d/comm" 2>/dev/null)" in
        containerd | containerd-shim* | dockerd) ;;
        *) continue ;;
        esac
        { tr '\0' ' ' <"$d/cmdline"; } 2>/dev/null | grep -qF -- "$L/" && echo "${d#/proc/}"
    done
    return 0
}

cmd_setup() {
    mkdir -p "$L/image"
    local missing=() p
    for p in docker.io busybox-static; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    if [ ${#missing[@]} -gt 0 ]; then
        [ "$(id -u)" -eq 0 ] || die "${missing[*]} missing; run as root"
        log "apt-get install ${missing[*]}"
        apt-get update -qq
        local prc=/usr/sbin/policy-rc.d created=0
        if [ ! -e $prc ]; then
            printf '#!/bin/sh\nexit 101\n' >$prc
            chmod +x $prc
            created=1
        fi
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
            { [ $created = 1 ] && rm -f $prc; die "apt-get install ${missing[*]} failed"; }
        [ $created = 1 ] && rm -f $prc
    fi
    if [ ! -f "$L/image/busybox.tar" ]; then
        log "building the busybox rootfs from busybox-static"
        local r=$L/image/rootfs a
        rm -rf "$r"
        mkdir -p "$r"/{bin,etc,tmp,proc,sys,dev,root}
        cp /bin/busybox "$r/bin/busybox"
        for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -sf busybox "$r/bin/$a"; done
        echo 'root:x:0:0:root:/root:/bin/sh' >"$r/etc/passwd"
        echo 'root:x:0:' >"$r/etc/group"
        chmod 1777 "$r/tmp"
        tar -C "$r" -cf "$L/image/busybox.tar.tmp" .
        mv "$L/image/busybox.tar.tmp" "$L/image/busybox.tar"
        rm -rf "$r"
    fi
    log "setup done: $(dockerd --version), $L/image/busybox.tar"
}

cmd_start() {
    if ! command -v dockerd >/dev/null || [ ! -f "$L/image/busybox.tar" ]; then die "run '$0 setup' first"; fi
    if ! dockerd_pid >/dev/null; then
        rm -f "$SOCK"
        mkdir -p "$L/root" "$L/exec"
        echo '{}' >"$L/daemon.json"
        # /run/docker/plugins is hard-coded in dockerd: note whether it was there, to remove only ours.
        [ -e /run/docker ] || touch "$L/created-run-docker"
        # dockerd 20.10 writes its trust key to /etc/docker/key.json (no flag moves it).
        [ -e /etc/docker/key.json ] || touch "$L/created-key-json"
        nohup dockerd --config-file "$L/daemon.json" --data-root "$L/root" --exec-root "$L/exec" \
            --pidfile "$PIDFILE" -H "unix://$SOCK" \
            --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false --bridge=none \
            --userland-proxy=false --storage-driver="${DOCKERLAB_STORAGE:-overlay2}" \
            --cgroup-parent "/$CGROUP" --containerd-namespace petrel-docker-lab \
            --containerd-plugins-namespace petrel-docker-lab-plugins \
            --log-driver json-file >>"$L/dockerd.log" 2>&1 </dev/null &
        for _ in $(seq 1 60); do
            dk version >/dev/null 2>&1 && break
            if ! kill -0 $! 2>/dev/null; then
                tail -20 "$L/dockerd.log" >&2
                die "dockerd exited; see $L/dockerd.log"
            fi
            sleep 0.5
        done
        dk version >/dev/null 2>&1 || die "dockerd not answering after 30 s; see $L/dockerd.log"
        log "dockerd pid $(cat "$PIDFILE"), log $L/dockerd.log"
    fi
    if ! dk image inspect "$IMAGE" >/dev/null 2>&1; then
        dk import -c 'ENV PATH=/bin' -c 'CMD ["/bin/sh"]' "$L/image/busybox.tar" "$IMAGE" >/dev/null
    fi
    echo "$SOCK"
}

cmd_run() {
    [ $# -ge 2 ] || die "usage: $0 run NAME COMMAND..."
    local name=$1
    shift
    dockerd_pid >/dev/null || die "dockerd not running: '$0 start' first"
    local args=(--name "$name" --network none --log-driver json-file) kv
    if [ -n "${DOCKERLAB_LABELS:-}" ]; then
        IFS=, read -ra kv <<<"$DOCKERLAB_LABELS"
        for l in "${kv[@]}"; do args+=(--label "$l"); done
    fi
    # shellcheck disable=SC2206 # word splitting of the extra arguments is the point
    [ -n "${DOCKERLAB_RUN_ARGS:-}" ] && args+=($DOCKERLAB_RUN_ARGS)
    local id
    id=$(dk run -d "${args[@]}" "$IMAGE" "$@")
    if [ "${DOCKERLAB_WAIT:-0}" = 1 ]; then
        for _ in $(seq 1 $((${DOCKERLAB_TIMEOUT:-60} * 4))); do
            [ "$(dk inspect -f '{{.State.Running}}' "$id")" = false ] && break
            sleep 0.25
        done
        [ "$(dk inspect -f '{{.State.Running}}' "$id")" = false ] || die "container $name still running"
    fi
    dk inspect -f '{{.LogPath}}' "$id"
}

cmd_stop() {
    local p
    if dockerd_pid >/dev/null && dk version >/dev/null 2>&1; then
        for p in $(dk ps -aq); do dk rm -f "$p" >/dev/null 2>&1 || true; done
    fi
    if p=$(dockerd_pid); then
        kill -TERM "$p"
        for _ in $(seq 1 80); do
            [ -d "/proc/$p" ] || break
            sleep 0.25
        done
        [ -d "/proc/$p" ] && kill -KILL "$p"
    fi
    rm -f "$PIDFILE"
    # dockerd's managed containerd and any shim left behind: by PID, named by our directory.
    for p in $(lab_pids); do kill -TERM "$p" 2>/dev/null || true; done
    for _ in $(seq 1 20); do
        [ -z "$(lab_pids)" ] && break
        sleep 0.25
    done
    for p in $(lab_pids); do kill -KILL "$p" 2>/dev/null || true; done
    # mounts under $L (overlay rootfs, shm, netns), deepest first
    awk -v L="$L/" 'index($5, L) == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
        umount -l "$m" 2>/dev/null || true
    done
    for p in /sys/fs/cgroup/*/"$CGROUP" /sys/fs/cgroup/"$CGROUP"; do
        if [ -d "$p" ]; then find "$p" -depth -type d -exec rmdir {} \; 2>/dev/null || true; fi
    done
    rm -rf "$L/root" "$L/exec" "$SOCK"
    if [ -f "$L/created-key-json" ] && [ -z "$(pgrep -x dockerd)" ]; then
        rm -f /etc/docker/key.json "$L/created-key-json"
    fi
    if [ -f "$L/created-run-docker" ] && [ -z "$(pgrep -x dockerd)" ]; then
        rmdir /run/docker/plugins /run/docker 2>/dev/null || true
        rm -f "$L/created-run-docker"
    fi
    # containerd 1.6 puts shim sockets in /run/containerd/s (hard-coded); empty once the shims are gone
    rmdir /run/containerd/s /run/containerd 2>/dev/null || true
    log "stopped"
}

case "${1:-}" in
setup) cmd_setup ;;
start) cmd_start ;;
run)
    shift
    cmd_run "$@"
    ;;
stop) cmd_stop ;;
clean)
    cmd_stop
    rm -rf "$L"
    ;;
docker)
    shift
    dk "$@"
    ;;
*)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
