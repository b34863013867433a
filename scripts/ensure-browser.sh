#!/usr/bin/env bash
# Provides what the panel's browser tests drive (tavern-api/tests/browser.rs): Debian's
# chromium, chromium-driver and a Chinese font (installed with apt when missing) and axe-core from npm (pinned,
# installed once under target/browser-tools). Prints the path of axe.min.js as its last line.
set -euo pipefail
cd "$(dirname "$0")/.."

# The browser tests run at once and each calls this script: one at a time (a second npm
# install into the same folder fails with ENOTEMPTY; two apt-gets fight over dpkg's lock).
tools="${CARGO_TARGET_DIR:-target}/browser-tools"
mkdir -p "$tools"
exec 9>"$tools/.lock"
flock 9

# A Chinese font, so the panel's Chinese pages are photographed as people see them.
has_cjk_font() { command -v fc-list >/dev/null 2>&1 && [ -n "$(fc-list :lang=zh 2>/dev/null)" ]; }
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1 || ! has_cjk_font; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "error: chromium and chromedriver are missing and apt-get is not available; install Chromium and its WebDriver" >&2
    exit 1
  fi
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    SUDO="sudo"
  fi
  echo "installing chromium, chromium-driver and a Chinese font (Debian) for the panel's browser tests" >&2
  $SUDO apt-get update >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y chromium chromium-driver fonts-wqy-microhei >&2
fi

AXE_VERSION=4.10.3
axe="$tools/node_modules/axe-core/axe.min.js"
if [ ! -f "$axe" ] || ! grep -q "\"version\": \"$AXE_VERSION\"" "$tools/node_modules/axe-core/package.json"; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "error: npm is needed to fetch axe-core $AXE_VERSION for the accessibility check" >&2
    exit 1
  fi
  mkdir -p "$tools"
  npm install --prefix "$tools" --no-audit --no-fund --loglevel=error "axe-core@$AXE_VERSION" >&2
fi
realpath "$axe"
