#!/usr/bin/env bash
# The Debian 13 (trixie) leg: a root built once with debootstrap from Debian's packages
# (python3-torch 2.6, gcc 14, oneDNN 3.x, UCX 1.18, Open MPI 5), reused by every later run.
#
#   tools/debian13/debian13.sh root           build the root (no-op when it is current)
#   tools/debian13/debian13.sh build          the root, then megamoe built in it (incremental)
#   tools/debian13/debian13.sh test           build, then the C tests (ctest) and the Python tests
#   tools/debian13/debian13.sh run CMD        build, then `bash -c CMD` in the root, in this
#                                             checkout, with the package importable (PYTHONPATH,
#                                             MEGAMOE_BUILD_DIR, LD_LIBRARY_PATH)
#
# The root lives in build/debian13/root (gitignored), the build made inside it in
# build/debian13/release (and its compiler cache in build/debian13/ccache). Every run enters a
# private mount namespace (unshare), mounts /proc, /sys, /dev, /dev/shm, /run and the checkout
# there and chroots: the mounts end with the process, so none is left behind even when a run is
# killed. Root only (debootstrap, chroot, mounts). Debian 13's torch 2.6 needs USE_LIBUV=0 for
# its TCPStore (torch.distributed's env:// rendezvous); every command here runs with it.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CHECKOUT="$(cd "$HERE/../.." && pwd)"
STATE="$CHECKOUT/build/debian13"
ROOT="$STATE/root"
MIRROR="${DEBIAN13_MIRROR:-http://deb.debian.org/debian}"
# What the root holds. A change of this list (or of this script's ROOT_FORMAT) rebuilds it.
# (libtorch-dev and python3-dev: torch.compile's inductor compiles C++ against them, and the
# Torch adapter builds against libtorch-dev; clang: tests/install/test_abi_layout.py.)
PACKAGES="python3-torch libtorch-dev python3-dev python3-numpy python3-pytest python3-venv
  python3-pip python3-setuptools python3-wheel python3-matplotlib python3-tqdm cmake make gcc g++
  pkg-config ccache clang libdnnl-dev libucx-dev libopenmpi-dev openmpi-bin iproute2 procps
  ca-certificates"
ROOT_FORMAT=1
STAMP_TEXT="format=$ROOT_FORMAT mirror=$MIRROR packages=$(echo $PACKAGES)"

log() { echo "debian13: $*" >&2; }

need_root() {
  if [ "$(id -u)" != 0 ]; then
    log "needs root (debootstrap, chroot and mounts); run it as root"
    exit 1
  fi
}

root_current() {
  [ -f "$ROOT/.megamoe-root" ] && [ "$(cat "$ROOT/.megamoe-root")" = "$STAMP_TEXT" ]
}

# The root's shell: a private mount namespace with /proc, /sys, /dev, /dev/shm, /run and the
# checkout (at the same path) mounted, then pivot_root into it (not chroot: the simulated hosts
# of `megamoe launch --hosts` enter mount namespaces with setns, which would leave a chroot for
# the namespace's real root). Arguments: the command to run inside.
enter() {
  unshare --mount --propagation private -- /bin/bash -euc '
    root=$1; checkout=$2; shift 2
    mount --bind "$root" "$root"  # a mount point of its own, for pivot_root
    mount -t proc proc "$root/proc"
    mount --rbind /sys "$root/sys"
    mount --rbind /dev "$root/dev"
    mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
    mkdir -p "$root/run" "$root$checkout" "$root/.host-root"
    mount -t tmpfs tmpfs "$root/run"
    mount --bind "$checkout" "$root$checkout"
    cd "$root"
    pivot_root . .host-root
    exec /usr/bin/env -i HOME=/root TERM="${TERM:-dumb}" LANG=C.UTF-8 \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin USE_LIBUV=0 \
      /bin/sh -c "umount -l /.host-root && cd / && exec \"\$@\"" enter "$@"
  ' enter "$ROOT" "$CHECKOUT" "$@"
}

BUILD="$STATE/release"
# The environment of the commands run in the checkout: the package of this checkout importable,
# its build found, the compiler cache kept in build/debian13 between runs.
inside() {
  enter /usr/bin/env -C "$CHECKOUT" PYTHONPATH="$CHECKOUT/python" MEGAMOE_BUILD_DIR="$BUILD" \
    CCACHE_DIR="$STATE/ccache" CMAKE_C_COMPILER_LAUNCHER=ccache \
    CMAKE_CXX_COMPILER_LAUNCHER=ccache JOBS="${JOBS:-$(nproc)}" "$@"
}

build_megamoe() {
  build_root
  local t0; t0=$(date +%s)
  inside /bin/bash -ec '
    if [ ! -f "$MEGAMOE_BUILD_DIR/CMakeCache.txt" ]; then
      cmake -S . -B "$MEGAMOE_BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
    fi
    cmake --build "$MEGAMOE_BUILD_DIR" -j "$JOBS" >"$MEGAMOE_BUILD_DIR/../build.log" 2>&1 || {
      tail -40 "$MEGAMOE_BUILD_DIR/../build.log"; exit 1; }'
  log "megamoe built in the root in $(( $(date +%s) - t0 )) s ($BUILD)"
}

run_tests() {
  build_megamoe
  local t0 rc=0; t0=$(date +%s)
  inside /bin/bash -c '
    set -o pipefail
    python3 -c "import torch, sys; print(\"debian13: torch\", torch.__version__, \"python\", sys.version.split()[0])"
    ctest --test-dir "$MEGAMOE_BUILD_DIR" -j "$JOBS" --output-on-failure ${CTEST_ARGS:-}; c=$?
    python3 -m pytest -q -p no:cacheprovider tests ${PYTEST_ARGS:-}; p=$?
    echo "debian13: ctest exit $c, pytest exit $p"
    [ $c = 0 ] && [ $p = 0 ]' || rc=$?
  log "tests ran in $(( $(date +%s) - t0 )) s (exit $rc)"
  return $rc
}

build_root() {
  need_root
  if root_current; then
    log "root is current ($ROOT, $(du -sh --apparent-size "$ROOT" 2>/dev/null | cut -f1)); reusing it"
    return
  fi
  command -v debootstrap >/dev/null || {
    log "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
  }
  local t0 new="$STATE/root.new"
  t0=$(date +%s)
  rm -rf "$new" "$ROOT"
  mkdir -p "$STATE"
  log "debootstrap trixie (minbase) from $MIRROR into $new"
  debootstrap --variant=minbase trixie "$new" "$MIRROR" >"$STATE/debootstrap.log" 2>&1 || {
    tail -20 "$STATE/debootstrap.log" >&2; log "debootstrap failed (log: $STATE/debootstrap.log)"; exit 1; }
  local t1; t1=$(date +%s)
  log "debootstrap: $((t1 - t0)) s; installing the packages with apt"
  ROOT="$new" enter /bin/sh -c "DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(echo $PACKAGES) \
    && apt-get clean && rm -rf /var/lib/apt/lists/*" >"$STATE/apt.log" 2>&1 || {
    tail -20 "$STATE/apt.log" >&2; log "apt-get install failed (log: $STATE/apt.log)"; exit 1; }
  grep -q localhost "$new/etc/hosts" 2>/dev/null || printf '127.0.0.1 localhost\n::1 localhost\n' >>"$new/etc/hosts"
  echo "$STAMP_TEXT" >"$new/.megamoe-root"
  mv "$new" "$ROOT"
  log "root built in $(( $(date +%s) - t0 )) s (apt: $(( $(date +%s) - t1 )) s), $(du -sh "$ROOT" | cut -f1)"
}

case "${1:-}" in
  root) build_root ;;
  build) need_root; build_megamoe ;;
  test) need_root; run_tests ;;
  run) shift; need_root; build_megamoe
       inside /usr/bin/env LD_LIBRARY_PATH="$BUILD/src" PATH="$BUILD/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
         /bin/bash -c "$*" ;;
  enter) shift; need_root; enter "$@" ;;  # the bare root (no build), e.g. `enter bash`
  *) echo "usage: $0 root | build | test | run CMD | enter CMD..." >&2; exit 2 ;;
esac
