#!/usr/bin/env bash
# Builds the router's Rust data path (cadencerl/router/_datapath.so), offline, from Debian bookworm's
# packaged crates; `make router-native` runs it (apt-get needs root the first time).
set -euo pipefail
cd "$(dirname "$0")"
command -v cargo >/dev/null || export PATH="$HOME/.cargo/bin:$PATH"     # rustup's, where a shell profile is not read
pkgs="librust-hyper-dev librust-tokio-dev librust-tokio-macros-dev librust-pyo3-dev librust-memchr-dev"
dpkg -s $pkgs >/dev/null 2>&1 || { export DEBIAN_FRONTEND=noninteractive; apt-get install -y -q $pkgs || { apt-get update -q && apt-get install -y -q $pkgs; }; }
PYO3_PYTHON="${PYO3_PYTHON:-$(cd ../.. && pwd)/.venv/bin/python}" cargo build --release
cp target/release/lib_datapath.so ../../cadencerl/router/_datapath.so
echo "built cadencerl/router/_datapath.so"
