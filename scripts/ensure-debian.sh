#!/usr/bin/env bash
# Installs Debian packages the test suite needs (a real PostgreSQL server, a real Chromium), once.
# Usage: scripts/ensure-debian.sh PACKAGE:PROBE_PATH ...
# A package whose probe path exists is skipped; the rest are installed with apt-get (as root).
set -euo pipefail
missing=()
for spec in "$@"; do
  package="${spec%%:*}"
  probe="${spec#*:}"
  if [ ! -e "$probe" ]; then
    missing+=("$package")
  fi
done
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "missing Debian packages: ${missing[*]} (install them with apt-get as root)" >&2
  exit 1
fi
echo "installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
