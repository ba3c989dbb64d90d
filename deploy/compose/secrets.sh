#!/usr/bin/env bash
# Generate the secrets docker-compose.yml requires, once: deploy/compose/secrets.env (mode 0600,
# git-ignored). Values already in the file are kept — InfluxDB and Grafana read theirs only when
# their volume is first created, so a new value would lock the services out of them. Run it
# before the first `up`:
#
#   deploy/compose/secrets.sh
#   docker compose --env-file deploy/compose/secrets.env -f deploy/docker-compose.yml up --build -d
#
# Without the env file compose refuses to start (every secret is ${NAME:?...}); nothing has a
# default such as admin/admin. docs/security.md lists what each secret protects.
set -euo pipefail

FILE=${1:-"$(cd -P -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)/secrets.env"}
# name → what it is (written as a comment above it)
NAMES=(FLOODGATE_INFLUX_TOKEN INFLUXDB_ADMIN_PASSWORD GRAFANA_ADMIN_PASSWORD FLOODGATE_CONSOLE_SESSION_SECRET FLOODGATE_CONSOLE_QUOTA_TOKEN FLOODGATE_DEFERRED_SIGNING_KEY)
# written from the ones above
DERIVED=(FLOODGATE_QUOTA_TOKENS)
declare -A WHAT=(
	[FLOODGATE_INFLUX_TOKEN]="InfluxDB 2 admin token; the services write and read metrics with it"
	[INFLUXDB_ADMIN_PASSWORD]="InfluxDB 2 user floodgate (UI on the compose network only)"
	[GRAFANA_ADMIN_PASSWORD]="Grafana user admin (http://127.0.0.1:3000)"
	[FLOODGATE_CONSOLE_SESSION_SECRET]="keys the console's sessions, CSRF tokens and device cookies"
	[FLOODGATE_CONSOLE_QUOTA_TOKEN]="the console's token for the quota usage API (FLOODGATE_QUOTA_TOKENS holds its hash)"
	[FLOODGATE_DEFERRED_SIGNING_KEY]="HMAC key of the deferred-work worker's signed principal header (upstreams verify it)"
)

random() { head -c 64 /dev/urandom | base64 | tr -d '\n/+=' | cut -c1-48; }

umask 077
touch "$FILE"
chmod 600 "$FILE"
added=0
for name in "${NAMES[@]}"; do
	if grep -q "^${name}=." "$FILE"; then
		continue
	fi
	if grep -q "^${name}=" "$FILE"; then
		echo "secrets.sh: $FILE has an empty $name; remove that line or set a value" >&2
		exit 1
	fi
	printf '# %s\n%s=%s\n' "${WHAT[$name]}" "$name" "$(random)" >>"$FILE"
	added=$((added + 1))
done
# The quota usage API accepts the console's token: name:role:sha256hex of it.
if ! grep -q '^FLOODGATE_QUOTA_TOKENS=.' "$FILE"; then
	tok=$(sed -n 's/^FLOODGATE_CONSOLE_QUOTA_TOKEN=//p' "$FILE")
	printf '# %s\nFLOODGATE_QUOTA_TOKENS=console:reader:%s\n' "the quota usage API's callers (the console's token, hashed)" \
		"$(printf '%s' "$tok" | sha256sum | cut -d' ' -f1)" >>"$FILE"
	added=$((added + 1))
fi
echo "secrets.sh: $FILE has $((${#NAMES[@]} + ${#DERIVED[@]})) secrets ($added new); pass it with --env-file"
