#!/usr/bin/env bash
# Installs Debian's chromium for the console's browser tests when it is missing
# (idempotent) and prints the binary's path. FLOODGATE_CHROMIUM overrides the
# path that is checked (default /usr/bin/chromium).
set -euo pipefail

bin="${FLOODGATE_CHROMIUM:-/usr/bin/chromium}"
if [[ -x "$bin" ]]; then
  echo "$bin"
  exit 0
fi
if [[ "$bin" != /usr/bin/chromium ]]; then
  echo "browser.sh: FLOODGATE_CHROMIUM=$bin is not an executable" >&2
  exit 1
fi
sudo=""
if [[ $(id -u) -ne 0 ]]; then
  sudo="sudo"
fi
echo "browser.sh: installing chromium from Debian's packages" >&2
export DEBIAN_FRONTEND=noninteractive
if ! $sudo apt-get install -y --no-install-recommends chromium >&2; then
  $sudo apt-get update >&2
  $sudo apt-get install -y --no-install-recommends chromium >&2
fi
if [[ ! -x "$bin" ]]; then
  echo "browser.sh: chromium installed but $bin is missing" >&2
  exit 1
fi
echo "$bin"
