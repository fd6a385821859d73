#!/usr/bin/env bash
# A private Apache httpd (Debian's apache2 package) for benchmarks and tests:
# its own config file in CONF_DIR, nothing from /etc/apache2, listening on
# 127.0.0.1:PORT only, serving CONF_DIR/htdocs/index.html.
#
#   bench/lib/apache.sh start CONF_DIR PORT [LOG_DIRECTIVE]
#       writes CONF_DIR/httpd.conf, starts httpd in the foreground mode
#       (-DFOREGROUND) in the background, waits (APACHE_START_TIMEOUT s,
#       default 30) until it listens, prints the pid of the parent httpd
#       and records it in CONF_DIR/apache.pid. Exit status 1 with the error
#       log on stderr when it does not start.
#   bench/lib/apache.sh stop CONF_DIR
#       SIGTERM to that pid, SIGKILL after APACHE_STOP_TIMEOUT s (default
#       15); then waits as long again for the processes it had started
#       (workers, piped loggers such as `petrel pipe`, which exit at EOF)
#       and kills those still there. Prints the pid; nothing if none ran.
#   bench/lib/apache.sh config CONF_DIR PORT [LOG_DIRECTIVE]
#       only writes the config; prints its path.
#   bench/lib/apache.sh pid CONF_DIR
#       prints the recorded pid if that process is alive (else exit 1).
#
# LOG_DIRECTIVE is one line of Apache config for the access log, used as
# is, e.g.
#   'CustomLog "/tmp/x/access.log" bench'
#   'CustomLog "|/usr/local/bin/petrel pipe --spool-dir /tmp/x/spool" bench'
# and empty (or "none") means no access log. The LogFormat `bench` is
# Apache's combined format plus the request's UNIQUE_ID (mod_unique_id), so
# that each line can be told apart when checking exactly-once delivery;
# `combined` is defined too. The error log is CONF_DIR/error.log.
#
# Environment: APACHE_BIN (default /usr/sbin/apache2), APACHE_MODULES
# (default /usr/lib/apache2/modules), APACHE_MPM (event, worker or prefork;
# default event), APACHE_USER / APACHE_GROUP (the workers' user, default
# www-data, else nobody/nogroup: httpd refuses to serve as root, so it
# starts as root and its workers switch; CONF_DIR and its parents must be
# searchable by that user). KeepAlive is Off, as in the seed's setup.
#
# Example (a Rust test runs the same through std::process::Command):
#   pid=$(bench/lib/apache.sh start "$dir" 18080 "CustomLog \"$dir/access.log\" bench")
#   ab -n 1000 -c 10 http://127.0.0.1:18080/
#   bench/lib/apache.sh stop "$dir"
set -euo pipefail
export LC_ALL=C

APACHE_BIN="${APACHE_BIN:-/usr/sbin/apache2}"
APACHE_MODULES="${APACHE_MODULES:-/usr/lib/apache2/modules}"
APACHE_MPM="${APACHE_MPM:-event}"
APACHE_START_TIMEOUT="${APACHE_START_TIMEOUT:-30}"
APACHE_STOP_TIMEOUT="${APACHE_STOP_TIMEOUT:-15}"
if [[ -z "${APACHE_USER:-}" ]]; then
    if id www-data >/dev/null 2>&1; then APACHE_USER=www-data; else APACHE_USER=nobody; fi
fi
if [[ -z "${APACHE_GROUP:-}" ]]; then
    APACHE_GROUP=$(id -gn "$APACHE_USER" 2>/dev/null || echo nogroup)
fi

die() { echo "bench/lib/apache.sh: $*" >&2; exit 1; }

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
}

write_config() { # CONF_DIR PORT LOG_DIRECTIVE
    local dir=$1 port=$2 log=${3:-}
    [[ "$port" =~ ^[0-9]+$ ]] || die "PORT must be a number, got '$port'"
    [[ -x "$APACHE_BIN" ]] || die "$APACHE_BIN not found (scripts/install-syslog-tools.sh)"
    local m mods=(mpm_"$APACHE_MPM" authz_core dir mime unique_id)
    for m in "${mods[@]}"; do
        [[ -f "$APACHE_MODULES/mod_$m.so" ]] || die "module $APACHE_MODULES/mod_$m.so not found"
    done
    mkdir -p "$dir/htdocs" "$dir/run"
    dir=$(cd "$dir" && pwd)
    chmod 755 "$dir" "$dir/htdocs"
    # A small static page: what is measured is the request path and the
    # logging, not the content.
    printf '<!doctype html>\n<title>petrel bench</title>\n<p>It works.</p>\n' > "$dir/htdocs/index.html"
    chmod 644 "$dir/htdocs/index.html"
    [[ "$log" == none ]] && log=""
    {
        echo "# Written by bench/lib/apache.sh: a private httpd, nothing from /etc/apache2."
        for m in "${mods[@]}"; do
            echo "LoadModule ${m}_module $APACHE_MODULES/mod_$m.so"
        done
        cat <<EOF
ServerRoot "$dir"
ServerName 127.0.0.1
Listen 127.0.0.1:$port
PidFile "$dir/httpd.pid"
DefaultRuntimeDir "$dir/run"
ErrorLog "$dir/error.log"
LogLevel warn
User $APACHE_USER
Group $APACHE_GROUP
KeepAlive Off
DocumentRoot "$dir/htdocs"
DirectoryIndex index.html
TypesConfig /dev/null
AddType text/html .html
<Directory />
    AllowOverride None
    Require all denied
</Directory>
<Directory "$dir/htdocs">
    Require all granted
</Directory>
LogFormat "%h %l %u %t \"%r\" %>s %b \"%{Referer}i\" \"%{User-agent}i\"" combined
LogFormat "%h %l %u %t \"%r\" %>s %b \"%{Referer}i\" \"%{User-agent}i\" %{UNIQUE_ID}e" bench
EOF
        [[ -z "$log" ]] || echo "$log"
    } > "$dir/httpd.conf"
    echo "$dir/httpd.conf"
}

listening() { # PORT: a TCP socket listens on 127.0.0.1:PORT
    awk -v a="$(printf '0100007F:%04X' "$1")" '$2 == a && $4 == "0A" { f = 1 } END { exit !f }' /proc/net/tcp
}

alive() { [[ -n "$1" ]] && kill -0 "$1" 2>/dev/null; }

# Every descendant of PID, deepest last.
descendants() {
    local c
    for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do
        echo "$c"
        descendants "$c"
    done
}

start() { # CONF_DIR PORT [LOG_DIRECTIVE]
    (($# >= 2 && $# <= 3)) || usage
    local dir=$1 port=$2 conf pid
    if [[ -f "$dir/apache.pid" ]] && alive "$(cat "$dir/apache.pid")"; then
        die "an httpd from $dir already runs (pid $(cat "$dir/apache.pid")); stop it first"
    fi
    if listening "$port"; then die "127.0.0.1:$port is already in use"; fi
    conf=$(write_config "$dir" "$port" "${3:-}")
    dir=$(dirname "$conf")
    if ! runuser -u "$APACHE_USER" -- test -r "$dir/htdocs/index.html" 2>/dev/null; then
        die "$APACHE_USER cannot read $dir/htdocs/index.html: CONF_DIR and its parents must be searchable by $APACHE_USER (or set APACHE_USER)"
    fi
    local check
    if ! check=$("$APACHE_BIN" -t -f "$conf" 2>&1); then
        die "httpd rejects $conf: $check"
    fi
    : > "$dir/error.log"
    # setsid: its own session, so that a terminal's Ctrl-C does not reach
    # it (stop does); stdio away from the caller, which may read our stdout
    # until every writer has closed it.
    setsid "$APACHE_BIN" -f "$conf" -DFOREGROUND < /dev/null > "$dir/apache.out" 2>&1 &
    pid=$!
    echo "$pid" > "$dir/apache.pid"
    local deadline=$((SECONDS + APACHE_START_TIMEOUT))
    until listening "$port"; do
        if ! alive "$pid" || ((SECONDS > deadline)); then
            echo "bench/lib/apache.sh: httpd did not listen on 127.0.0.1:$port within ${APACHE_START_TIMEOUT} s; error log:" >&2
            cat "$dir/error.log" "$dir/apache.out" >&2 2>/dev/null || true
            stop "$dir" >/dev/null
            exit 1
        fi
        sleep 0.05
    done
    echo "$pid"
}

stop() { # CONF_DIR
    (($# == 1)) || usage
    local dir=$1 pid kids
    [[ -f "$dir/apache.pid" ]] || return 0
    pid=$(cat "$dir/apache.pid")
    if ! alive "$pid"; then
        rm -f "$dir/apache.pid"
        return 0
    fi
    # Its workers and piped loggers, known before it goes.
    kids=$(descendants "$pid")
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + APACHE_STOP_TIMEOUT))
    while alive "$pid" && ((SECONDS <= deadline)); do sleep 0.05; done
    if alive "$pid"; then
        echo "bench/lib/apache.sh: httpd $pid still running after ${APACHE_STOP_TIMEOUT} s; SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null || true
    fi
    # Piped loggers see EOF once every httpd process has gone; give them the
    # same time to finish (petrel pipe makes its last fsync).
    local k
    deadline=$((SECONDS + APACHE_STOP_TIMEOUT))
    for k in $kids; do
        while alive "$k" && ((SECONDS <= deadline)); do sleep 0.05; done
        if alive "$k"; then
            echo "bench/lib/apache.sh: pid $k ($(tr '\0' ' ' < "/proc/$k/cmdline" 2>/dev/null)) still running; SIGKILL" >&2
            kill -KILL "$k" 2>/dev/null || true
        fi
    done
    # The parent is our child only when start ran in this same shell.
    wait "$pid" 2>/dev/null || true
    rm -f "$dir/apache.pid"
    echo "$pid"
}

cmd=${1:-}
(($#)) && shift
case "$cmd" in
start) start "$@" ;;
stop) stop "$@" ;;
config) (($# >= 2 && $# <= 3)) || usage; write_config "$@" ;;
pid)
    (($# == 1)) || usage
    [[ -f "$1/apache.pid" ]] && alive "$(cat "$1/apache.pid")" || exit 1
    cat "$1/apache.pid"
    ;;
*) usage ;;
esac
