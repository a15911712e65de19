#!/usr/bin/env bash
# Builds native_datapath.so beside this script, offline, from Debian bookworm's packaged crates.
set -euo pipefail
cd "$(dirname "$0")"
dpkg -s librust-hyper-dev librust-tokio-dev librust-pyo3-dev >/dev/null 2>&1 \
  || apt-get install -y -q librust-hyper-dev librust-tokio-dev librust-tokio-macros-dev librust-pyo3-dev
PYO3_PYTHON="${PYO3_PYTHON:-$(cd ../.. && pwd)/.venv/bin/python}" cargo build --release
cp target/release/libnative_datapath.so native_datapath.so
echo "built $(pwd)/native_datapath.so"
