# Shared by tools/*.sh: install what the build and tests need, and build.
# Source it; it defines functions only.

NVFS_TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
NVFS_BUILD=${NVFS_BUILD:-$NVFS_TOP/build}

# Debian packages the build, the tests and the demo use.
NVFS_PACKAGES=(
  meson ninja-build pkg-config g++ python3
  libfuse3-dev fuse3 libpmem2-dev libboost-dev catch2
  e2fsprogs util-linux
  git rsync make gcc attr  # tests/mount_tools.sh: ordinary tools on a mount
)

nvfs_install_deps() {
  local missing=() pkg
  for pkg in "${NVFS_PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
      || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

nvfs_build() {
  if [ ! -f "$NVFS_BUILD/build.ninja" ]; then
    meson setup "$NVFS_BUILD" "$NVFS_TOP" >/dev/null
  fi
  ninja -C "$NVFS_BUILD" >/dev/null
}
