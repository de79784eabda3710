#!/usr/bin/env bash
# Lets `cargo build --features cuda` build offline. cubecl-cuda 0.11.3 always
# depends on cubecl-llvm, whose build script (tracel-llvm-bundler) would
# download an LLVM 23 archive; instead point it at Debian's LLVM 22 (the route
# recorded in shared/cubecl.md). Prints the environment to export.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
if ! command -v llvm-config-22 >/dev/null 2>&1; then
  apt-get update -qq
  apt-get install -y -qq llvm-22-dev libpolly-22-dev libzstd-dev libz3-dev >/dev/null
fi
prefix="$(llvm-config-22 --prefix)"
data="${XDG_DATA_HOME:-$HOME/.local/share}"
dir="$data/tracel/tracel-llvm-23.1.0-4"
mkdir -p "$dir"
for sub in bin lib include; do
  [ -e "$dir/$sub" ] || ln -s "$prefix/$sub" "$dir/$sub"
done
touch "$dir/.tracel-llvm-installed"
# Debian's llvm-config names libz3 by path; give the linker a `-llibz3` to find.
z3="$(ls /usr/lib/x86_64-linux-gnu/libz3.so* 2>/dev/null | head -n 1)"
links="$data/tracel/links"
mkdir -p "$links"
[ -e "$links/liblibz3.so" ] || ln -s "$z3" "$links/liblibz3.so"
echo "export XDG_DATA_HOME=$data RUSTFLAGS=\"\${RUSTFLAGS:-} -L $links\""
