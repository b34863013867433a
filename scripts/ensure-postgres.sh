#!/usr/bin/env bash
# Installs Debian's PostgreSQL server when its programs are missing: the PostgreSQL store tests
# (`cargo test -p tavern-store --features postgres`) start a throwaway cluster from them, with
# TLS certificates made by openssl.
set -euo pipefail

INITDB=/usr/lib/postgresql/15/bin/initdb
if [ -x "$INITDB" ] && command -v openssl >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: $INITDB is missing and apt-get is not available; install PostgreSQL 15 server programs" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
  SUDO="sudo"
fi
echo "installing PostgreSQL and openssl (Debian packages postgresql, openssl) for the PostgreSQL store tests" >&2
$SUDO apt-get update
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y postgresql openssl
if [ ! -x "$INITDB" ]; then
  echo "error: postgresql was installed but $INITDB is still missing (a version other than 15?)" >&2
  exit 1
fi
