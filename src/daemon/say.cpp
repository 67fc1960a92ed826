// The daemon's messages (say.hpp).
#include "daemon/say.hpp"

#include <syslog.h>

#include <cstdarg>
#include <cstdio>

namespace nvfs::daemon {

namespace {

// Before the daemon detaches, messages go to stderr; after, to syslog too.
bool g_detached = false;

}  // namespace

void SetDetached(bool detached) { g_detached = detached; }

void Say(const char* fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "nvfs: %s\n", line);
  if (g_detached) syslog(LOG_ERR, "%s", line);
}

int UsageError(const char* message) {
  std::fprintf(stderr, "nvfs: %s\nTry 'nvfs --help' for more information.\n", message);
  return 1;
}

}  // namespace nvfs::daemon
