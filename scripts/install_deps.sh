#!/usr/bin/env bash
# Installs what Slipstream needs on Debian 12 (apt-get); skips what is there.
#   bash scripts/install_deps.sh [--tests]
set -euo pipefail
pkgs=(build-essential cmake libtorch-dev libgloo-dev libyaml-cpp-dev libcli11-dev
      nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev libopenblas0-pthread
      libvtk9-dev)
# --tests: what the tests need besides (OpenFOAM, for the Ahmed case generator's test).
[ "${1:-}" = --tests ] && pkgs+=(openfoam)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
