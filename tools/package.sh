#!/usr/bin/env bash
# Builds the Debian packages of nvfs with debhelper (dh, meson), then checks
# them with lintian:
#   nvfs                the programs and their man pages
#   libnvfs-direct0     the direct-read library
#   libnvfs-direct-dev  its header, link and pkg-config file
#
# The packaging lives in tools/debian/ (the top of the tree has no debian/):
# this script copies the source tree into a scratch folder, puts
# tools/debian/ there as debian/, writes debian/changelog from meson's
# project version, and runs dpkg-buildpackage. Installs what it uses; can be
# run again (the scratch folder is rebuilt each time; ccache makes the
# compile of an unchanged tree short).
#
#   tools/package.sh                # .deb files in build-package/
#   NVFS_PACKAGE_DIR=DIR tools/package.sh
#
# Ends with the .deb files' paths and lintian's verdict; exits non-zero on a
# failed build or a lintian error (warnings are printed, not fatal).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"

nvfs_install_deps "${NVFS_PACKAGE_TOOLS[@]}"

out=${NVFS_PACKAGE_DIR:-$NVFS_TOP/build-package}
version=$(sed -n "s/^ *version *: *'\([^']*\)'.*/\1/p" "$NVFS_TOP/meson.build" | head -1)
[ -n "$version" ] || { echo "package.sh: no version in meson.build" >&2; exit 1; }
arch=$(dpkg-architecture -qDEB_HOST_ARCH)
tree=$out/nvfs-$version

# The scratch tree: the source files git knows of (tracked, or new and not
# ignored), so build folders and images stay out; a tree without git is
# copied whole but for its build folders.
rm -rf "$tree"
mkdir -p "$tree"
if git -C "$NVFS_TOP" rev-parse --git-dir >/dev/null 2>&1; then
  # (A file deleted but not yet committed is left out.)
  (cd "$NVFS_TOP" && git ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done) |
    rsync -a --from0 --files-from=- "$NVFS_TOP/" "$tree/"
  commit="git $(git -C "$NVFS_TOP" rev-parse --short HEAD)"
  when=$(git -C "$NVFS_TOP" log -1 --format=%aD)
  git -C "$NVFS_TOP" diff --quiet HEAD 2>/dev/null || commit="$commit and changes"
else
  rsync -a --exclude '/build*/' --exclude '*.img' "$NVFS_TOP/" "$tree/"
  commit="a tree without git"
  when=$(date -R)
fi
rm -rf "$tree/debian"
cp -a "$NVFS_TOP/tools/debian" "$tree/debian"
cat > "$tree/debian/changelog" <<EOF
nvfs ($version) unstable; urgency=medium

  * Built by tools/package.sh from $commit.

 -- nvfs maintainers <maintainers@users.noreply.a-seed-0ed09ca3.example>  $when
EOF

# debhelper gives each build step a HOME of its own (compat 13), where
# ccache would start from an empty cache: keep the user's.
if command -v ccache >/dev/null; then
  CCACHE_DIR=${CCACHE_DIR:-$(ccache -k cache_dir)}
  export CCACHE_DIR
fi

rm -f "$out"/*.deb "$out"/*.ddeb "$out"/*.changes "$out"/*.buildinfo
start=$(date +%s)
(cd "$tree" && dpkg-buildpackage -b -us -uc -j"$(nproc)") > "$out/build.log" 2>&1 || {
  tail -40 "$out/build.log"
  echo "package.sh: dpkg-buildpackage failed; the whole log is $out/build.log" >&2
  exit 1
}
echo "built in $(( $(date +%s) - start )) s (log: $out/build.log)"

changes=$out/nvfs_${version}_$arch.changes
ls -1 "$out"/*.deb
# lintian's tags at every level but pedantic and experimental; only errors fail.
lintian --fail-on error --display-info "$changes" | tee "$out/lintian.txt" || {
  echo "package.sh: lintian found errors (above; also in $out/lintian.txt)" >&2
  exit 1
}
echo "lintian: no errors ($(grep -c '^W:' "$out/lintian.txt" || true) warnings," \
  "$(grep -c '^I:' "$out/lintian.txt" || true) notes; $out/lintian.txt)"
echo "install test: NVFS_PACKAGE_DIR=$out meson test -C ${NVFS_BUILD#"$NVFS_TOP"/} --suite package"
