#!/usr/bin/env bash
# Builds HiGHS (the MILP solver the C++ solver uses to prove small dense problems optimal) as
# a static library under build/highs/install, once; later runs return at once. Neither
# Debian nor PyPI ships its C++ library and headers, but the highspy source package on PyPI
# carries the whole HiGHS source, so it is downloaded from there (~1.4 MB, ~3.5 min to build
# on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."

version=1.12.0
root=$PWD/build/highs
prefix=$root/install
[ -f "$prefix/lib/libhighs.a" ] && [ -f "$prefix/.version-$version" ] && exit 0

rm -rf "$root"
mkdir -p "$root/download"
python3 -m pip download -q --no-deps --no-binary highspy "highspy==$version" -d "$root/download"
tar xzf "$root/download/highspy-$version.tar.gz" -C "$root"
src=$root/highspy-$version
# The source package leaves out two things HiGHS's top CMakeLists names even when only the
# library is built: the pkg-config template and the command-line app's folder.
touch "$src/highs.pc.in"
mkdir -p "$src/app" && touch "$src/app/CMakeLists.txt"
log=$root/build.log
if ! { cmake -S "$src" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
         -DBUILD_TESTING=OFF -DBUILD_CXX_EXE=OFF -DBUILD_EXAMPLES=OFF -DZLIB=OFF \
         -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DCMAKE_INSTALL_PREFIX="$prefix" &&
       cmake --build "$root/build" -j 2 && cmake --install "$root/build"; } >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  echo "scripts/build_highs.sh: building HiGHS $version failed; the whole log is $log" >&2
  exit 1
fi
rm -rf "$root/build" "$src" "$root/download" "$log"
touch "$prefix/.version-$version"
