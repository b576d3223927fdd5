#!/usr/bin/env bash
# Installs what is missing (apt-get), builds, and runs the default training.
# Arguments go to `slipstream train` (key=value overrides).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
exec ./build/app/slipstream train "$@"
