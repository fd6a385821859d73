#!/usr/bin/env bash
# Installs the peers and load generators of bench/syslog.sh and
# bench/apache.sh, only what is missing (running it again changes nothing):
#
#   syslog-ng-core   syslog-ng, and loggen (the syslog load generator), apt
#   rsyslog          rsyslogd, unpacked into .cache/rsyslog (see below)
#   rsyslog-openssl  rsyslog's TLS driver (lmnsd_ossl), unpacked beside it,
#                    for the syslog sink's TLS tests
#   apache2          httpd (apache2), its modules in /usr/lib/apache2/modules, apt
#   apache2-utils    ab (ApacheBench), apt
#   bsdutils         logger (util-linux), apt
#
#   scripts/install-syslog-tools.sh
#
# Debian's rsyslog and syslog-ng-core conflict (both provide
# system-log-daemon): apt installs one and removes the other. So
# syslog-ng-core comes from apt, and rsyslog, unless it is already the
# installed package, is fetched with `apt-get download` and unpacked with
# `dpkg-deb -x` into .cache/rsyslog (git-ignored); its libraries (libestr0,
# libfastjson4, liblognorm5) come from apt. bench/syslog.sh runs
# .cache/rsyslog/usr/sbin/rsyslogd with `-M` pointing at its modules. apt
# runs with --no-remove: this script never removes a package. If rsyslog is
# the installed system logger, the script stops instead of replacing it.
#
# The packages' system services must not run on this machine (they would
# take /dev/log, port 514 and port 80, and write to /var/log): the install
# runs with a /usr/sbin/policy-rc.d that forbids starting services (exit
# 101), put back as it was afterwards, and any rsyslogd, syslog-ng or
# apache2 process that appears during the install without a config file of
# its own (`-f`) is stopped by its pid. The benchmarks start private
# instances with their own config files. Needs root and apt-get; prints
# the versions at the end.
set -euo pipefail
export LC_ALL=C
export DEBIAN_FRONTEND=noninteractive

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RSYSLOG_DIR="$ROOT/.cache/rsyslog"

die() { echo "install-syslog-tools.sh: $*" >&2; exit 1; }
((EUID == 0)) || die "needs root (apt-get install)"
command -v apt-get >/dev/null || die "needs apt-get (Debian or Ubuntu)"

APT_PACKAGES=(syslog-ng-core apache2 apache2-utils bsdutils libestr0 libfastjson4 liblognorm5)
DAEMONS=(rsyslogd syslog-ng apache2)
# Another apt/dpkg may be running on this shared machine: wait for its lock.
APT_OPTS=(-y -q -o DPkg::Lock::Timeout=600)

installed() { [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" == "install ok installed" ]]; }

daemon_pids() {
    local d
    for d in "${DAEMONS[@]}"; do pgrep -x "$d" || true; done | sort
}

# Runs "$@" (an apt-get command) with a policy-rc.d that forbids starting
# services, then stops daemons that started anyway.
without_services() {
    local policy=/usr/sbin/policy-rc.d saved="" had_devlog=0 before after pid args rc=0
    [[ -e /dev/log ]] && had_devlog=1
    before=$(daemon_pids)
    if [[ -e "$policy" ]]; then
        saved=$(mktemp /tmp/policy-rc.d.saved.XXXXXX)
        cp -p "$policy" "$saved"
    fi
    # shellcheck disable=SC2064  # $saved is meant to be expanded now
    trap "if [[ -n '$saved' ]]; then cp -p '$saved' '$policy'; rm -f '$saved'; else rm -f '$policy'; fi" EXIT
    printf '#!/bin/sh\n# install-syslog-tools.sh: no service starts during the install\nexit 101\n' > "$policy"
    chmod 755 "$policy"
    "$@" || rc=$?
    if [[ -n "$saved" ]]; then cp -p "$saved" "$policy"; rm -f "$saved"; else rm -f "$policy"; fi
    trap - EXIT

    # Daemons a service manager that ignores policy-rc.d started: new since
    # the install began, and running the system configuration (no `-f FILE`
    # of their own, as the benchmarks pass).
    after=$(daemon_pids)
    for pid in $(comm -13 <(echo "$before") <(echo "$after")); do
        args=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null || true)
        [[ -n "$args" && " $args" != *" -f "* ]] || continue
        echo "== stopping $args(pid $pid), started by the install" >&2
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    done
    # A /dev/log socket left by a stopped daemon would make logger(1) and
    # syslog(3) callers fail instead of falling back. (A socket someone
    # listens on is listed with its path in /proc/net/unix.)
    if ((had_devlog == 0)) && [[ -S /dev/log ]] && ! grep -q ' /dev/log$' /proc/net/unix; then
        rm -f /dev/log
    fi
    return "$rc"
}

apt_install() {
    # --no-remove: installing syslog-ng-core must not remove an installed
    # rsyslog (or anything else); apt then fails instead.
    if ! apt-get "${APT_OPTS[@]}" install --no-install-recommends --no-remove "$@"; then
        echo "== apt-get install failed; updating the package lists and retrying" >&2
        apt-get -q -o DPkg::Lock::Timeout=600 update
        apt-get "${APT_OPTS[@]}" install --no-install-recommends --no-remove "$@"
    fi
}

if installed rsyslog && ! installed syslog-ng-core; then
    die "rsyslog is the installed system logger and syslog-ng-core (loggen) conflicts with it; this script does not replace it"
fi

missing=()
for p in "${APT_PACKAGES[@]}"; do installed "$p" || missing+=("$p"); done
if ((${#missing[@]})); then
    echo "== apt-get install: ${missing[*]}" >&2
    without_services apt_install "${missing[@]}"
else
    echo "== already installed: ${APT_PACKAGES[*]}" >&2
fi

# rsyslog, unpacked (not installed) unless it is the installed package.
RSYSLOGD=""
if installed rsyslog; then
    RSYSLOGD=/usr/sbin/rsyslogd
    installed rsyslog-openssl || without_services apt_install rsyslog-openssl
else
    want=$(apt-cache policy rsyslog | awk '/Candidate:/ {print $2}')
    [[ -n "$want" && "$want" != "(none)" ]] || die "apt has no rsyslog candidate (apt-get update?)"
    if [[ "$(cat "$RSYSLOG_DIR/.version" 2>/dev/null)" != "$want" ]] ||
        ! compgen -G "$RSYSLOG_DIR/usr/lib/*/rsyslog/lmnsd_ossl.so" >/dev/null; then
        echo "== apt-get download rsyslog=$want rsyslog-openssl=$want, unpacking into $RSYSLOG_DIR" >&2
        debs=$(mktemp -d /tmp/rsyslog-deb.XXXXXX)
        # APT::Sandbox::User=root: the _apt user cannot write the mktemp dir.
        (cd "$debs" && apt-get -q -o APT::Sandbox::User=root download "rsyslog=$want" "rsyslog-openssl=$want")
        rm -rf "$RSYSLOG_DIR"
        mkdir -p "$RSYSLOG_DIR"
        dpkg-deb -x "$debs"/rsyslog_*.deb "$RSYSLOG_DIR"
        dpkg-deb -x "$debs"/rsyslog-openssl_*.deb "$RSYSLOG_DIR"
        rm -rf "$debs"
        echo "$want" > "$RSYSLOG_DIR/.version"
    fi
    RSYSLOGD="$RSYSLOG_DIR/usr/sbin/rsyslogd"
    # Its libraries came in as dependencies of nothing installed: keep
    # `apt-get autoremove` away from them.
    apt-mark manual libestr0 libfastjson4 liblognorm5 >/dev/null
fi
"$RSYSLOGD" -v >/dev/null || die "$RSYSLOGD does not run (missing libraries?): $("$RSYSLOGD" -v 2>&1 | head -3)"

# loggen is /usr/bin/loggen in Debian's syslog-ng-core; older packages kept
# it under /usr/lib/syslog-ng.
LOGGEN=$(command -v loggen || true)
[[ -n "$LOGGEN" ]] || LOGGEN=$(find /usr/lib/syslog-ng -name loggen -type f -perm -u+x 2>/dev/null | sort | tail -1)
[[ -n "$LOGGEN" ]] || die "loggen not found after installing syslog-ng-core"
for b in /usr/sbin/syslog-ng /usr/sbin/apache2 /usr/bin/ab /usr/bin/logger; do
    [[ -x "$b" ]] || die "$b not found after the install"
done

for d in "${DAEMONS[@]}"; do
    for pid in $(pgrep -x "$d" || true); do
        echo "note: $d pid $pid is running: $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null)" >&2
    done
done

echo "loggen:    $LOGGEN (syslog-ng-core $(dpkg-query -W -f='${Version}' syslog-ng-core))"
echo "syslog-ng: /usr/sbin/syslog-ng, $(/usr/sbin/syslog-ng --version | head -1)"
echo "rsyslogd:  $RSYSLOGD, $("$RSYSLOGD" -v | head -1 | tr -s ' \t' ' ' | sed 's/ compiled with://')"
echo "apache2:   /usr/sbin/apache2, $(/usr/sbin/apache2 -v | head -1) ($(dpkg-query -W -f='${Version}' apache2))"
echo "ab:        $(ab -V | head -1)"
echo "logger:    $(logger --version)"
