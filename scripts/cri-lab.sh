#!/usr/bin/env bash
# cri-lab.sh — real containers through containerd's CRI plugin, no registry, no CNI, no crictl.
# (Adapted from the CEO's shared/cri-lab.sh; pods are created from Rust through CRI, see
# crates/petrel-cri/src/lab.rs, so the slow Go build of crictl is gone.)
#
#   cri-lab.sh setup      apt-get install containerd runc busybox-static umoci gcc libc6-dev (no system containerd
#                         is started); build two local images (busybox, pause) as OCI tarballs under $CRILAB_CACHE.
#                         Idempotent; a second run does nothing.
#   cri-lab.sh start      start a private containerd (own --config: root/state/socket under $CRILAB_DIR), wait
#                         (bounded) for its CRI plugin, import the images into namespace k8s.io with `ctr`;
#                         prints the CRI socket path.
#   cri-lab.sh run-pod NAME NS CMD...
#                         a host-network pod NAME in namespace NS + one container "main" running CMD..., created by
#                         the crate's example (cargo run -p petrel-cri --example cri-lab); prints the pod log dir
#                         $CRILAB_DIR/pods/NS_NAME_UID (log file <dir>/main/0.log).
#                         Env: CRILAB_LABELS="k=v,k2=v2", CRILAB_ANNOTATIONS, CRILAB_CONTAINER=main, CRILAB_IMAGE.
#   cri-lab.sh stop       kill all containers (runc), stop containerd and any leftover shim by PID, unmount,
#                         remove the cgroups and containerd's root/state. Keeps logs ($CRILAB_DIR/pods).
#   cri-lab.sh clean      stop, then rm -rf $CRILAB_DIR (and $CRILAB_CACHE when it is inside it).
#   cri-lab.sh ctr ARGS... | env     helpers (ctr against this containerd; shell exports).
#
# Env: CRILAB_DIR   containerd's root/state/socket, pod logs   (default <repo>/.cache/crilab)
#      CRILAB_CACHE image tarballs built by setup               (default $CRILAB_DIR)
#      CRILAB_CGROUP cgroup parent name for the pods            (default crilab; the lab client must use /$CRILAB_CGROUP)
#      CRILAB_NICE  nice level of containerd, shims, containers (default 10)
# Several labs can run at once with different CRILAB_DIR and CRILAB_CGROUP (tests give each its own temp dir
# and share CRILAB_CACHE).
#
# What you get, like a kubelet node (kubelet itself is not run; the lab client does its small part):
#   - log files  $CRILAB_DIR/pods/<ns>_<pod>_<uid>/<container>/<attempt>.log, written by containerd itself (lines
#     over 16384 bytes are split into P records ending with an F record)
#   - metadata over CRI gRPC (runtime.v1) at unix://$CRILAB_DIR/containerd.sock
# Notes: the pod sandbox image is a local "pause" (static C program). Host network + host UTS (no CNI needed).
# cgroupfs driver (this machine has cgroup v1). containerd 1.6 puts shim sockets in /run/containerd/s/
# (hard-coded); they go away with the shims.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
L=${CRILAB_DIR:-$REPO/.cache/crilab}
C=${CRILAB_CACHE:-$L}
CG=${CRILAB_CGROUP:-crilab}
NICE=${CRILAB_NICE:-10}
BUSYBOX_IMAGE=localhost/crilab/busybox:1
PAUSE_IMAGE=localhost/crilab/pause:1
SOCK=$L/containerd.sock
PIDFILE=$L/containerd.pid

log() { echo "cri-lab: $*" >&2; }
die() { echo "cri-lab: error: $*" >&2; exit 1; }

ctr_() { ctr -a "$SOCK" -n k8s.io "$@"; }

containerd_pid() {
  local p
  [ -f "$PIDFILE" ] || return 1
  p=$(cat "$PIDFILE")
  [ -n "$p" ] && [ -d "/proc/$p" ] && [ "$(cat /proc/$p/comm 2>/dev/null)" = containerd ] || return 1
  echo "$p"
}

cri_ready() {  # the CRI plugin loaded (it registers with containerd's plugin list once initialised)
  ctr -a "$SOCK" plugins ls 2>/dev/null | grep -Eq '^io\.containerd\.grpc\.v1[[:space:]]+cri[[:space:]].*[[:space:]]ok[[:space:]]*$'
}

# ---------------------------------------------------------------- setup
apt_install() {
  local missing=() p
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  # policy-rc.d 101: never let the package start a system containerd
  local prc=/usr/sbin/policy-rc.d created=0
  if [ ! -e $prc ]; then printf '#!/bin/sh\nexit 101\n' > $prc; chmod +x $prc; created=1; fi
  DEBIAN_FRONTEND=noninteractive nice -n "$NICE" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  [ $created = 1 ] && rm -f $prc
  return 0
}

# shellcheck source=lib/oci.sh
. "$REPO/scripts/lib/oci.sh"

# build_image NAME ROOTFS_DIR TAR [umoci config args...]: tagged 1, scratch space under $C/image
build_image() {
  local name=$1 rootfs=$2 tar=$3; shift 3
  oci_archive "$C/image/work-$name" "$rootfs" 1 "$tar" "$@"
}

build_images() {
  mkdir -p "$C/image"
  if [ ! -f "$C/image/busybox.tar" ]; then
    log "building image $BUSYBOX_IMAGE from busybox-static"
    local r=$C/image/rootfs-busybox a
    rm -rf "$r"; mkdir -p "$r"/{bin,etc,tmp,proc,sys,dev,root}
    cp /bin/busybox "$r/bin/busybox"
    for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -sf busybox "$r/bin/$a"; done
    echo 'root:x:0:0:root:/root:/bin/sh' > "$r/etc/passwd"; echo 'root:x:0:' > "$r/etc/group"
    chmod 1777 "$r/tmp"
    build_image busybox "$r" "$C/image/busybox.tar" --config.env PATH=/bin --config.cmd /bin/sh \
      --config.label crilab.image=busybox
    rm -rf "$r"
  fi
  if [ ! -f "$C/image/pause.tar" ]; then
    log "building image $PAUSE_IMAGE (static C pause)"
    local r=$C/image/rootfs-pause
    rm -rf "$r"; mkdir -p "$r"
    cat > "$C/image/pause.c" <<'EOF'
/* pod sandbox "pause": sleep forever, reap zombies, exit 0 on INT/TERM */
#include <signal.h>
#include <unistd.h>
#include <sys/wait.h>
static void die(int s) { (void)s; _exit(0); }
static void reap(int s) { (void)s; while (waitpid(-1, 0, WNOHANG) > 0) ; }
int main(void) {
  struct sigaction a = {0};
  a.sa_handler = die; sigaction(SIGINT, &a, 0); sigaction(SIGTERM, &a, 0);
  a.sa_handler = reap; a.sa_flags = SA_NOCLDSTOP; sigaction(SIGCHLD, &a, 0);
  for (;;) pause();
}
EOF
    nice -n "$NICE" gcc -Os -static -o "$r/pause" "$C/image/pause.c"
    strip "$r/pause"
    build_image pause "$r" "$C/image/pause.tar" --config.entrypoint /pause --config.user 65535:65535
    rm -rf "$r"
  fi
}

write_config() {
  mkdir -p "$L/etc" "$L/cni/bin" "$L/cni/net.d"
  local runc; runc=$(command -v runc || echo /usr/sbin/runc)
  cat > "$L/etc/config.toml" <<EOF
# generated by cri-lab.sh
version = 2
root = "$L/root"
state = "$L/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[debug]
  level = "info"
[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "$L/opt"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "$PAUSE_IMAGE"
    disable_apparmor = true
    disable_tcp_service = true
    # root here lacks CAP_SYS_RESOURCE: without this the sandbox's oom_score_adj -998 makes runc fail
    # ("can't get final child's PID from pipe: EOF"); this clamps it to containerd's own (0).
    restrict_oom_score_adj = true
    max_container_log_line_size = 16384
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "$L/cni/bin"
      conf_dir = "$L/cni/net.d"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          BinaryName = "$runc"
          Root = "$L/state/runc"
          SystemdCgroup = false
EOF
}

cmd_setup() {
  mkdir -p "$L" "$C"
  apt_install containerd runc busybox-static umoci gcc libc6-dev
  build_images
  log "setup done: $C/image/{busybox,pause}.tar"
}

# ---------------------------------------------------------------- start
cmd_start() {
  command -v containerd >/dev/null && [ -f "$C/image/busybox.tar" ] && [ -f "$C/image/pause.tar" ] ||
    die "run '$0 setup' first (CRILAB_CACHE=$C)"
  write_config
  if ! containerd_pid >/dev/null; then
    [ -e "$SOCK" ] && rm -f "$SOCK" "$SOCK.ttrpc"
    mkdir -p "$L/root" "$L/state" "$L/opt" "$L/pods"
    nohup nice -n "$NICE" containerd --config "$L/etc/config.toml" >>"$L/containerd.log" 2>&1 </dev/null &
    echo $! > "$PIDFILE"
    local i
    for i in $(seq 1 120); do
      cri_ready && break
      containerd_pid >/dev/null || die "containerd exited; see $L/containerd.log"
      sleep 0.5
    done
    cri_ready || die "containerd CRI not ready after 60 s; see $L/containerd.log"
    log "containerd pid $(cat "$PIDFILE"), log $L/containerd.log"
  fi
  local img tar
  for img in "$BUSYBOX_IMAGE:busybox" "$PAUSE_IMAGE:pause"; do
    tar=$C/image/${img##*:}.tar; img=${img%:*}
    if ! ctr_ images check "name==$img" 2>/dev/null | grep -q complete; then
      ctr_ images import --base-name "${img%:*}" "$tar" >/dev/null
    fi
  done
  echo "$SOCK"
}

# ---------------------------------------------------------------- run-pod
cmd_run_pod() {
  [ $# -ge 3 ] || die "usage: $0 run-pod NAME NAMESPACE COMMAND..."
  containerd_pid >/dev/null || die "containerd not running: '$0 start' first"
  CRILAB_DIR=$L CRILAB_CGROUP=$CG nice -n "$NICE" cargo run -q --release --manifest-path "$REPO/Cargo.toml" \
    -p petrel-cri --features lab --example cri-lab -- "$SOCK" "$L/pods" "$@"
}

# ---------------------------------------------------------------- stop
shim_pids() {  # containerd-shim processes started for our socket
  local d
  for d in /proc/[0-9]*; do
    { tr '\0' ' ' < "$d/cmdline"; } 2>/dev/null | grep -q "containerd-shim.* -address $SOCK " && echo "${d#/proc/}"
  done
  return 0
}

cmd_stop() {
  local p
  # every container and sandbox: kill them through runc, which owns their state (pod metadata goes with
  # containerd's root below, so there is no need to remove pods through CRI first)
  if [ -d "$L/state/runc/k8s.io" ]; then
    for p in $(runc --root "$L/state/runc/k8s.io" list -q 2>/dev/null); do
      runc --root "$L/state/runc/k8s.io" delete --force "$p" 2>/dev/null || true
    done
  fi
  if p=$(containerd_pid); then
    kill -CONT "$p" 2>/dev/null || true   # a test may have frozen it
    kill -TERM "$p"
    for _ in $(seq 1 40); do [ -d "/proc/$p" ] || break; sleep 0.25; done
    [ -d "/proc/$p" ] && kill -KILL "$p"
  fi
  rm -f "$PIDFILE"
  # shims left behind: kill by PID, then remove the socket the shim could not clean up
  # (containerd 1.6: /run/containerd/s/sha256("<containerd address>/<namespace>/<shim id>"))
  local id
  for p in $(shim_pids); do
    id=$({ tr '\0' '\n' < "/proc/$p/cmdline"; } 2>/dev/null | sed -n '/^-id$/{n;p;q}')
    kill -KILL "$p" 2>/dev/null || true
    [ -n "$id" ] && rm -f "/run/containerd/s/$(printf '%s' "$SOCK/k8s.io/$id" | sha256sum | cut -d' ' -f1)"
  done
  # mounts under $L (rootfs overlays, shm), deepest first
  awk -v L="$L/" 'index($5, L) == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
  # cgroup parent /$CG in every v1 hierarchy, or the v2 tree (children first)
  for p in /sys/fs/cgroup/*/"$CG" /sys/fs/cgroup/"$CG"; do
    [ -d "$p" ] && find "$p" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  rm -rf "$L/root" "$L/state" "$L/opt" "$SOCK" "$SOCK.ttrpc"
  rmdir /run/containerd/s /run/containerd 2>/dev/null || true
  log "stopped; logs kept in $L/pods"
}

case "${1:-}" in
  setup) cmd_setup ;;
  start) cmd_start ;;
  run-pod) shift; cmd_run_pod "$@" ;;
  stop) cmd_stop ;;
  clean) cmd_stop; rm -rf "$L" "$C/image" ;;
  ctr) shift; ctr_ "$@" ;;
  env) echo "export CONTAINER_RUNTIME_ENDPOINT=unix://$SOCK CONTAINERD_ADDRESS=$SOCK CONTAINERD_NAMESPACE=k8s.io CRILAB_DIR=$L CRILAB_CGROUP=$CG" ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
