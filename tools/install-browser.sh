#!/usr/bin/env bash
# Install headless Chromium and chromedriver, Debian's packages, for the Airflow UI test
# (tests/airflow/test_airflow_ui.py). Fast and silent when /usr/bin/chromium and
# /usr/bin/chromedriver exist. Browser downloads of their own (Selenium Manager,
# `playwright install`) are never used.
set -euo pipefail

if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
  exit 0
fi
how="install Debian's chromium and chromium-driver packages (or your system's Chromium and its chromedriver at /usr/bin)"
if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: the UI test needs /usr/bin/chromium and /usr/bin/chromedriver: $how" >&2
  exit 1
fi
as_root=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "error: not root and no sudo: $how" >&2; exit 1; }
  as_root=(sudo)
fi
echo "installing chromium and chromium-driver (apt-get, for the Airflow UI test)"
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
/usr/bin/chromium --version 2>/dev/null
/usr/bin/chromedriver --version
