#!/usr/bin/env bash
# The tools of scripts/arm/check_bits.py from Debian's (or Ubuntu's) packages: the aarch64 cross
# compiler (g++; clang cross-compiles with its libraries too) and qemu-user. Needs root (or sudo); does nothing where both are already installed.
set -euo pipefail
if command -v aarch64-linux-gnu-g++ >/dev/null && command -v clang++ >/dev/null &&
   { command -v qemu-aarch64 >/dev/null || command -v qemu-aarch64-static >/dev/null; }; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "install_tools.sh: no apt-get here; install an aarch64 cross g++ and qemu-user (qemu-aarch64) by hand" >&2
  exit 2
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "install_tools.sh: needs root or sudo" >&2; exit 2; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends g++-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user clang
