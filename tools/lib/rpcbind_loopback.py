#!/usr/bin/python3 -I
"""Runs Debian's rpcbind in the foreground listening on loopback only:
/run/rpcbind.sock, 127.0.0.1:111 and ::1:111 (TCP and UDP).

rpcbind has no option for that (its -h binds UDP only, and TCP on every
address), but it takes its sockets from systemd's socket activation
(LISTEN_PID, LISTEN_FDS; fds from 3): this script binds them and execs
rpcbind, whose PID is then this script's. Used by tools/nfs_bench.sh;
tests/mount/nfs_fixture.cpp does the same in C++. Refuses if something already
answers on /run/rpcbind.sock (use that rpcbind instead).
"""
import fcntl
import os
import socket
import sys

SOCKET_PATH = "/run/rpcbind.sock"
RPCBIND = "/usr/sbin/rpcbind"


def answers(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def main():
    if answers(SOCKET_PATH):
        sys.exit(f"rpcbind_loopback: an rpcbind already answers on {SOCKET_PATH}")
    try:
        os.unlink(SOCKET_PATH)  # nothing answers: a stale file
    except FileNotFoundError:
        pass
    socks = []
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(SOCKET_PATH)
    unix.listen(64)
    socks.append(unix)
    for family, addr in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
            try:
                s = socket.socket(family, kind)
            except OSError:
                continue  # no IPv6 here
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((addr, 111))
            if kind == socket.SOCK_STREAM:
                s.listen(64)
            socks.append(s)
    # Out of the way of 3..3+n first, then into place, inheritable.
    high = [fcntl.fcntl(s.fileno(), fcntl.F_DUPFD, 100) for s in socks]
    for s in socks:
        s.close()
    for i, fd in enumerate(high):
        os.dup2(fd, 3 + i, inheritable=True)
        os.close(fd)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LISTEN_")}
    env["LISTEN_PID"] = str(os.getpid())
    env["LISTEN_FDS"] = str(len(high))
    os.execve(RPCBIND, ["rpcbind", "-f"], env)


if __name__ == "__main__":
    main()
