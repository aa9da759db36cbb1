#!/usr/bin/env bash
# Install Debian's headless-capable Chromium for the browser test (tests/test_browser.py).
# Playwright drives it through executable_path=/usr/bin/chromium; Playwright's own browser
# download is not used (it needs network access to a CDN this environment may not have).
# Idempotent: does nothing when /usr/bin/chromium already runs.
set -euo pipefail

CHROMIUM=${CHROMIUM:-/usr/bin/chromium}

if [ -x "$CHROMIUM" ] && "$CHROMIUM" --headless --no-sandbox --disable-gpu --version >/dev/null 2>&1; then
    echo "chromium already installed: $("$CHROMIUM" --version 2>/dev/null)"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "install-chromium.sh: need root (or sudo) to apt-get install chromium" >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends chromium fonts-dejavu-core
echo "installed: $("$CHROMIUM" --version 2>/dev/null)"
