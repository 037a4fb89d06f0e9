#!/usr/bin/env bash
# Installs the build into a fresh prefix outside the source tree, then builds
# examples/c/two_rank_experts.c against that prefix twice, with pkg-config and with
# find_package(megamoe), and runs each on 2 ranks with the installed `megamoe launch`.
# Usage: install_consumers.sh <build dir> <example .c> <C compiler>
set -euo pipefail
build=$1 example=$2 cc=$3
work=$(mktemp -d /tmp/megamoe-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
soname=$(readelf -d "$prefix/lib/libmegamoe.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
abi=$(sed -n 's/^#define MEGAMOE_ABI_VERSION \([0-9]*\).*/\1/p' "$prefix/include/megamoe/version.h")
for f in "lib/$soname" include/megamoe/megamoe.h bin/megamoe lib/pkgconfig/megamoe.pc \
         lib/cmake/megamoe/megamoeConfig.cmake; do
  [ -e "$prefix/$f" ] || { echo "missing in the installed prefix: $f"; exit 1; }
done
[ "$soname" = "libmegamoe.so.$abi" ] || { echo "SONAME $soname, expected libmegamoe.so.$abi"; exit 1; }

mkdir "$work/src"
cp "$example" "$work/src/two_rank_experts.c"
cd "$work/src"

# The executable must load the installed library, not the one in the build tree.
uses_prefix() {
  local lib
  lib=$(ldd "$1" | awk '/libmegamoe\.so/ {print $3}')
  [ -n "$lib" ] && [ "$(readlink -f "$lib")" = "$(readlink -f "$prefix/lib/$soname")" ] || {
    echo "$1 loads '$lib', not the installed $prefix/lib/$soname"; exit 1; }
}

echo "== pkg-config"
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
libdir=$(pkg-config --variable=libdir megamoe)
[ "$(pkg-config --modversion megamoe)" = "$("$prefix/bin/megamoe" info | sed -n 's/^megamoe \([0-9.]*\).*/\1/p' | head -1)" ] \
  || { echo "pkg-config version differs from megamoe info"; "$prefix/bin/megamoe" info | head -3; exit 1; }
# shellcheck disable=SC2046
"$cc" -std=c11 -Wall -Wextra -Werror two_rank_experts.c -o ex_pkgconfig \
  $(pkg-config --cflags --libs megamoe) -Wl,-rpath,"$libdir"
uses_prefix ./ex_pkgconfig
"$prefix/bin/megamoe" launch -n 2 --timeout 60 -- ./ex_pkgconfig

echo "== find_package"
cat > CMakeLists.txt <<'CM'
cmake_minimum_required(VERSION 3.25)
project(megamoe_consumer C)
find_package(megamoe 0.1 REQUIRED CONFIG)
add_executable(two_rank_experts two_rank_experts.c)
target_link_libraries(two_rank_experts PRIVATE megamoe::megamoe)
CM
cmake -S . -B build -DCMAKE_C_COMPILER="$cc" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build build >/dev/null
uses_prefix build/two_rank_experts
"$prefix/bin/megamoe" launch -n 2 --timeout 60 -- build/two_rank_experts
echo "installed prefix: both consumers built and ran"
