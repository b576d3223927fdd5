#!/usr/bin/env bash
# Fills the git-ignored folders that device calls carry (run here, on the
# Debian machine, before `run` with carry [".deb", ".fixtures"]):
#   .deb/       Debian packages of the dependencies the GPU image lacks
#   .fixtures/  a copy of ../shared/fixtures (shared/ beside the checkout does not travel)
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deb .fixtures
(cd .deb && apt-get download $(cat ../scripts/device_debs.txt))
cp ../shared/fixtures/* .fixtures/
ls .deb .fixtures
