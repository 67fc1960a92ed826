// The daemon's messages: one line each, "nvfs: ..." on stderr, and to
// syslog too once the daemon has detached (SetDetached).
#pragma once

namespace nvfs::daemon {

void Say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// After fuse_daemonize: from now on messages go to syslog as well.
void SetDetached(bool detached);

// A wrong command line: the message and where to find help; returns 1, the
// exit status.
int UsageError(const char* message);

}  // namespace nvfs::daemon
