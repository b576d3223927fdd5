#!/usr/bin/env bash
# Installs what is missing (apt-get), builds, and runs every test (CTest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh --tests
bash scripts/build.sh "$@"
cd build && ctest --output-on-failure -j2
