// Preloaded into the daemon (LD_PRELOAD) to make it see a libfuse other
// than the one installed: fuse_version() and fuse_pkgversion() answer
// NVFS_FAKE_FUSE_VERSION ("3.17.1": 317 and "3.17.1"). Only the version is
// faked; the rest of libfuse is the real one. For the refusal case of
// test_mount_lifecycle.cpp (src/fuse/transport.hpp, LibfuseUnsupported).
#include <cstdio>
#include <cstdlib>

extern "C" {

__attribute__((visibility("default"))) const char* fuse_pkgversion(void) {
  const char* fake = std::getenv("NVFS_FAKE_FUSE_VERSION");
  return fake != nullptr ? fake : "0.0.0";
}

__attribute__((visibility("default"))) int fuse_version(void) {
  unsigned major = 0, minor = 0;
  if (std::sscanf(fuse_pkgversion(), "%u.%u", &major, &minor) != 2) return 0;
  return static_cast<int>(major * 100 + minor);  // FUSE_MAKE_VERSION
}

}  // extern "C"
