# Shared by tools/*.sh: install what the build and tests need, and build.
# Source it; it defines functions only.

NVFS_TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
NVFS_BUILD=${NVFS_BUILD:-$NVFS_TOP/build}

# Debian packages the build, the tests and the demo use.
NVFS_PACKAGES=(
  meson ninja-build pkg-config g++ python3
  libfuse3-dev fuse3 libpmem2-dev libboost-dev catch2
  liburing-dev  # FUSE over io_uring (src/fuse/uring.cpp)
  e2fsprogs util-linux
  dpkg-dev  # dpkg-buildflags: the package's hardening flags (nvfs_build)
  git rsync make gcc attr sqlite3  # tests/mount/mount_tools.sh: ordinary tools on a mount
  acl  # tests/mount/mount_acl.sh: setfacl, getfacl
  strace  # tests/mount/test_direct_write.cpp: counts the system calls of a program under the preload
  fio  # tests/mount/mount_uring.sh: a caller that keeps reads queued
  # tests/mount/test_nfs.cpp, tools/nfs_bench.sh: the NFS export (doc/ganesha.conf)
  nfs-ganesha nfs-ganesha-vfs rpcbind libnfs-dev libnfs-utils
)

# Packages whose install would start a system service (on a machine run by
# systemd, Debian starts a package's service when it is installed): ganesha
# on every address with /etc/ganesha's export, and rpcbind on port 111 of
# every address. The suite starts its own, on 127.0.0.1 only, and stops
# them; nvfs_install_deps keeps these from starting (policy-rc.d, below).
NVFS_NO_START_PACKAGES=(nfs-ganesha rpcbind)

# What fstests needs (tools/xfstests.sh only: check.sh never runs fstests):
# its build, the tools its tests call, and the peer's build (g++, fuse3).
NVFS_XFSTESTS_PACKAGES=(
  acl attr automake autoconf bc dbench dump e2fsprogs fio gawk gcc g++ indent
  libacl1-dev libaio-dev libcap-dev libgdbm-dev libgdbm-compat-dev libtool
  libtool-bin liburing-dev libuuid1 make psmisc python3 quota sed sqlite3
  uuid-dev uuid-runtime xfsdump xfsprogs xfslibs-dev libfuse3-dev fuse3
  pkg-config patch util-linux duperemove
)

# What tools/package.sh uses to build and check the Debian packages, and the
# install test (tests/package/package_install.sh) to read their man pages.
NVFS_PACKAGE_TOOLS=(
  debhelper dpkg-dev fakeroot lintian groff man-db rsync git ccache
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
  # invoke-rc.d and deb-systemd-invoke ask policy-rc.d whether to start a
  # service; 101 is "no". Only where the machine has no policy of its own,
  # only for this install, and only if it brings a package that would.
  local policy=/usr/sbin/policy-rc.d made_policy=""
  for pkg in "${NVFS_NO_START_PACKAGES[@]}"; do
    if [[ " ${missing[*]} " == *" $pkg "* ]] && [ ! -e "$policy" ]; then
      printf '#!/bin/sh\n# nvfs_install_deps (tools/lib/common.sh), during one apt-get install\nexit 101\n' \
        | $sudo tee "$policy" >/dev/null
      $sudo chmod 755 "$policy"
      made_policy=1
      break
    fi
  done
  local rc=0
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null || rc=$?
  [ -z "$made_policy" ] || $sudo rm -f "$policy"
  return $rc
}

# The compiler and linker flags Debian's package build uses
# (tools/debian/rules: hardening=+all), as meson options: the build that
# check.sh tests and demo.sh runs is compiled as the package is, so what
# those flags reject (-Werror=format-security, say) fails here first.
nvfs_package_flags() {
  local flags
  flags() { (cd "$NVFS_TOP" && DEB_BUILD_MAINT_OPTIONS=hardening=+all dpkg-buildflags --get "$1"); }
  printf '%s\n' "-Dcpp_args=$(flags CPPFLAGS) $(flags CXXFLAGS)" \
    "-Dcpp_link_args=$(flags LDFLAGS)"
}

nvfs_build() {
  local options
  mapfile -t options < <(nvfs_package_flags)
  if [ ! -f "$NVFS_BUILD/build.ninja" ]; then
    meson setup "$NVFS_BUILD" "$NVFS_TOP" "${options[@]}" >/dev/null
  elif [ "$(cat "$NVFS_BUILD/.nvfs-flags" 2>/dev/null)" != "${options[*]}" ]; then
    meson configure "$NVFS_BUILD" "${options[@]}" >/dev/null
  fi
  printf '%s' "${options[*]}" > "$NVFS_BUILD/.nvfs-flags"
  # Quiet when it builds; the compiler's errors when it does not.
  if ! ninja -C "$NVFS_BUILD" > "$NVFS_BUILD/ninja.log" 2>&1; then
    grep -E -A3 'error|FAILED' "$NVFS_BUILD/ninja.log" | head -60 >&2
    echo "nvfs: the build failed (whole log: $NVFS_BUILD/ninja.log)" >&2
    return 1
  fi
  nvfs_relink_direct_lib "$NVFS_BUILD"
}

# libnvfs-direct.so was a file until the library got its soversion (the
# Debian package); in a build folder from before, meson's regeneration
# cannot put its link libnvfs-direct.so -> .so.0 where the old file was,
# and ninja then deletes the file: the link (LD_PRELOAD=build/libnvfs-direct.so,
# tools/tsan.sh, tools/bench.py) appears at the next regeneration, forced here.
nvfs_relink_direct_lib() {
  if [ -e "$1/libnvfs-direct.so.0" ] && [ ! -e "$1/libnvfs-direct.so" ]; then
    meson setup --reconfigure "$1" "$NVFS_TOP" >/dev/null
  fi
}

# The sanitizer build (AddressSanitizer + UndefinedBehaviorSanitizer): only
# what the given meson suites run is built, not the whole project.
NVFS_ASAN_BUILD=${NVFS_ASAN_BUILD:-$NVFS_TOP/build-asan}
nvfs_build_asan() {
  if [ ! -f "$NVFS_ASAN_BUILD/build.ninja" ]; then
    meson setup "$NVFS_ASAN_BUILD" "$NVFS_TOP" -Db_sanitize=address,undefined \
      -Db_lundef=false >/dev/null
  fi
  # Regenerates the build (if meson.build changed) so the list of tests below
  # is current.
  ninja -C "$NVFS_ASAN_BUILD" build.ninja >/dev/null
  local targets
  # The tests' own programs and what they depend on (test_direct_client runs
  # direct_helper, for one).
  targets=$(meson introspect --tests --targets "$NVFS_ASAN_BUILD" | python3 -c '
import json, os, sys
build, suites = sys.argv[1], set(sys.argv[2:])
info = json.load(sys.stdin)
files = {t["id"]: t["filename"] for t in info["targets"]}
targets = {"mkfs.nvfs", "fsck.nvfs"}
for test in info["tests"]:
    if suites & {s.split(":")[-1] for s in test["suite"]}:
        targets.add(os.path.relpath(test["cmd"][0], build))
        for dep in test.get("depends", []):
            for f in files.get(dep, []):
                targets.add(os.path.relpath(f, build))
print(" ".join(sorted(targets)))' "$NVFS_ASAN_BUILD" "$@")
  # shellcheck disable=SC2086
  ninja -C "$NVFS_ASAN_BUILD" $targets >/dev/null
  nvfs_relink_direct_lib "$NVFS_ASAN_BUILD"
}
