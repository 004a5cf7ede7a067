#!/usr/bin/env bash
# Install the Debian packages the tests need, when running as root and they are missing.
# Elsewhere (no root, no apt) it only says what is missing; the tests that need a package
# skip with a reason naming it.
set -euo pipefail
missing=()
for pkg in "$@"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  echo "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "note: missing Debian packages (tests that need them will skip): ${missing[*]}" >&2
fi
