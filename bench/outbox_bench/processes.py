"""Process accounting from /proc: CPU seconds of a process, of its JIT threads, of the children
it reaped, of the whole machine; memory (VmHWM, VmRSS); the sockets a process holds and the
processes or ports at their other end (how a contender's PostgreSQL sessions are found); a free
local port."""

import os
import re
import socket
import subprocess

CLK_TCK = os.sysconf("SC_CLK_TCK")


def stat_cpu(path):
    """utime + stime from a /proc stat file, seconds; None when it is gone."""
    try:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def proc_cpu(pid):
    """utime + stime of the whole thread group, seconds; None when the process is gone."""
    return stat_cpu(f"/proc/{pid}/stat")


def proc_jit_cpu(pid):
    """utime + stime of a JVM's JIT compiler threads ("C1 CompilerThre", "C2 CompilerThre"),
    seconds; None when the process is gone."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    total = 0.0
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/comm") as f:
                if "CompilerThre" not in f.read():
                    continue
        except OSError:
            continue  # a thread that ended meanwhile
        total += stat_cpu(f"/proc/{pid}/task/{t}/stat") or 0.0
    return total


def proc_children_cpu(pid):
    """cutime + cstime: CPU of the children `pid` has reaped (the postmaster reaps backends)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[13]) + int(fields[14])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def proc_ppid(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def machine_busy_cpu():
    """CPU seconds all CPUs spent not idle (user+nice+system+irq+softirq+steal), /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / CLK_TCK


def proc_status_kb(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children_cpu(parent):
    """{pid: cpu seconds} of the live children of `parent` (the postmaster's: every backend,
    walsender and background process of the cluster)."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == parent:
                out[int(name)] = (int(fields[11]) + int(fields[12])) / CLK_TCK
        except (OSError, IndexError, ValueError):
            continue
    return out


def socket_inodes(pid):
    """Inodes of the sockets process `pid` holds."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return set()
    return inodes


def unix_peer_pids(pid):
    """Pids at the other end of the Unix-socket connections process `pid` holds (`ss -xp`
    knows each connected socket's peer inode and owner): the contender's PostgreSQL backends
    when it connects through the server's socket."""
    mine = socket_inodes(pid)
    if not mine:
        return set()
    out = subprocess.run(["ss", "-xpnH"], capture_output=True, text=True).stdout
    peer_of, owner_of = {}, {}
    for line in out.splitlines():
        m = re.search(r"(\d+)\s+\S+\s+(\d+)\s+users:\(\(\"[^\"]*\",pid=(\d+)", line)
        if m:
            peer_of[m.group(1)] = m.group(2)
            owner_of[m.group(1)] = int(m.group(3))
    return {owner_of[peer_of[i]] for i in mine
            if i in peer_of and peer_of[i] in owner_of and owner_of[peer_of[i]] != pid}


def client_ports(pid, server_port):
    """Local ports of the TCP connections process `pid` holds to 127.0.0.1:`server_port`: how
    the harness finds a contender's PostgreSQL sessions whatever it calls them (the Java and Go
    peers name their sessions differently from the relay, and some not at all)."""
    inodes = socket_inodes(pid)
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if len(parts) < 10 or parts[9] not in inodes:
                        continue
                    remote_port = int(parts[2].rsplit(":", 1)[1], 16)
                    if remote_port == server_port:
                        ports.add(int(parts[1].rsplit(":", 1)[1], 16))
        except OSError:
            continue
    return ports
