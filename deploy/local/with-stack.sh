#!/usr/bin/env bash
# Run a command with the local stack up (and the 3-master Redis Cluster used by the
# cluster tests), then stop only what this run started. `make test` and `make demo`
# use it, so a developer's running stack is left alone and a fresh machine (or CI)
# gets everything installed, started and stopped again.
#
#   deploy/local/with-stack.sh <command> [args...]
set -euo pipefail

SCRIPT_DIR=$(cd -P -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
STACK=$SCRIPT_DIR/stack.sh
COMPONENTS=(redis dynamodb influxdb kafka)

(($#)) || { echo "usage: with-stack.sh <command> [args...]" >&2; exit 2; }

started=()
for c in "${COMPONENTS[@]}"; do
	if ! "$STACK" status "$c" >/dev/null 2>&1; then
		started+=("$c")
	fi
done
cluster_started=0
if [ "${FLOODGATE_WITH_CLUSTER:-1}" = 1 ] && ! "$STACK" redis-cluster status >/dev/null 2>&1; then
	cluster_started=1
fi

cleanup() {
	local rc=$?
	if ((cluster_started)); then
		"$STACK" redis-cluster down || true
	fi
	if ((${#started[@]})); then
		echo "with-stack: stopping what this run started: ${started[*]}"
		"$STACK" down "${started[@]}" || true
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if ((${#started[@]})); then
	"$STACK" up "${started[@]}"
else
	echo "with-stack: the local stack is already running; leaving it running afterwards"
fi
if ((cluster_started)); then
	"$STACK" redis-cluster up
fi
"$@"
