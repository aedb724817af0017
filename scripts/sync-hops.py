#!/usr/bin/env python3
"""Where a synchronous commit's time goes through walrelay, stage by stage, from a packet
capture of `walrelay bench`'s sync-commit runs (issue #12, docs/keeping-up.md, nineteenth
round).

    tcpdump -i lo -s 96 -w cap.pcap tcp &
    WALRELAY_KEEP_TMP=1 walrelay bench --workload pgbench --cold-secs 3 --warmup-secs 1 \
        --steady-secs 3 --sync-secs 10
    kill %1
    # ports from the kept directory: the primary's `port`; in w-downstream.toml its
    # `listen` and its `upstream` (the bench's counting forwarder); in w-upstream.toml
    # the link's `listen`
    scripts/sync-hops.py cap.pcap <primary> <downstream> <upstream link> <forwarder>

The sync runs are the last two pgbench connections that send `END;` (relayed first, then
direct). For each commit it takes, after pgbench's `END;`: the first XLogData the primary sends
anyone, the upstream's first bytes on the link, the forwarder's, the downstream's first
XLogData to its standby; the WAL end that commit needs (the end of the XLogData sent before
the answer); the standby's first status update whose write and whose flush reach it; the
first status update reaching the primary with that flush (relayed: the upstream's standby
connection); and the primary's answer to pgbench. Printed as medians from `END;`, in
microseconds. tcpdump's timestamps, one host: each step includes the wake-ups of whatever
reads and writes the sockets. Standard library only.
"""
import statistics
import struct
import sys


def packets(path):
    """(time, src port, dst port, payload head) of each IPv4 TCP packet carrying data."""
    out = []
    with open(path, "rb") as f:
        head = f.read(24)
        nano = struct.unpack("<I", head[:4])[0] == 0xA1B23C4D
        off = 14 if struct.unpack("<I", head[20:24])[0] == 1 else 16
        while True:
            h = f.read(16)
            if len(h) < 16:
                return out
            sec, frac, incl, _ = struct.unpack("<IIII", h)
            d = f.read(incl)
            ip = d[off:]
            if len(ip) < 20 or ip[0] >> 4 != 4:
                continue
            ihl = (ip[0] & 15) * 4
            total = struct.unpack(">H", ip[2:4])[0]
            tcp = ip[ihl:]
            if len(tcp) < 14:
                continue
            doff = (tcp[12] >> 4) * 4
            if total - ihl - doff <= 0:
                continue
            sport, dport = struct.unpack(">HH", tcp[:4])
            out.append((sec + frac / (1e9 if nano else 1e6), sport, dport, tcp[doff:]))


def messages(payload):
    """(tag, body head, length) of the protocol messages a packet's payload starts with."""
    i = 0
    while i + 5 <= len(payload):
        ln = struct.unpack(">I", payload[i + 1 : i + 5])[0]
        yield payload[i], payload[i + 5 : i + 5 + 24], ln
        i += 1 + ln


def xlogdata_end(p):
    """End of the WAL in a packet's XLogData messages, or None."""
    end = None
    for tag, body, ln in messages(p[3]):
        if tag == ord("d") and body[:1] == b"w" and len(body) >= 9:
            end = struct.unpack(">Q", body[1:9])[0] + ln - 4 - 25
    return end


def status(p):
    """(write, flush) of the first standby status update a packet carries, or None."""
    for tag, body, _ in messages(p[3]):
        if tag == ord("d") and body[:1] == b"r" and len(body) >= 17:
            return struct.unpack(">QQ", body[1:17])
    return None


def commits(pk, prim, pg):
    """(index of END;, index of the primary's answer) of pgbench connection `pg`."""
    ends = [i for i, p in enumerate(pk) if p[1] == pg and p[2] == prim and b"END;" in p[3][:16]]
    for k, i in enumerate(ends):
        lim = ends[k + 1] if k + 1 < len(ends) else len(pk)
        ans = next((j for j in range(i + 1, lim) if pk[j][1] == prim and pk[j][2] == pg), None)
        if ans is not None:
            yield i, ans


def first(pk, lo, hi, cond):
    return next((j for j in range(lo, hi) if cond(pk[j])), None)


def run(pk, prim, pg, steps, standby_port):
    """Medians of each step's time from END; (`steps`: name, condition on a packet)."""
    times = {name: [] for name, _ in steps}
    for k in ("write reply", "flush reply", "primary has the flush", "answer"):
        times[k] = []
    for i, ans in commits(pk, prim, pg):
        t0 = pk[i][0]
        for name, cond in steps:
            j = first(pk, i + 1, ans, cond)
            if j is not None:
                times[name].append((pk[j][0] - t0) * 1e6)
        ends = [e for e in (xlogdata_end(pk[j]) for j in range(i + 1, ans)
                            if pk[j][1] == standby_port[0] and standby_port[1](pk[j])) if e]
        if not ends:
            continue
        need = max(ends)

        def reply(p, which):
            if p[2] != standby_port[2] or p[1] == pg:
                return False
            s = status(p)
            return s is not None and s[which] >= need

        w = first(pk, i + 1, ans, lambda p: reply(p, 0))
        f = first(pk, i + 1, ans, lambda p: reply(p, 1))
        if w is None or f is None:
            continue
        if standby_port[2] != prim:
            u = first(pk, f + 1, ans, lambda p: p[2] == prim and p[1] != pg
                      and (status(p) or (0, 0))[1] >= need)
            if u is None:
                continue
        else:
            u = f
        for name, j in (("write reply", w), ("flush reply", f),
                        ("primary has the flush", u), ("answer", ans)):
            times[name].append((pk[j][0] - t0) * 1e6)
    return times


def show(title, times):
    print(title)
    for name, v in times.items():
        if v:
            print(f"  {name:34s} n={len(v):6d}  p50 {statistics.median(v):7.1f} us")


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    pk = packets(sys.argv[1])
    prim, down, up, fwd = map(int, sys.argv[2:6])
    firsts = {}
    for i, p in enumerate(pk):
        if p[2] == prim and b"END;" in p[3][:16]:
            firsts.setdefault(p[1], i)
    if len(firsts) < 2:
        sys.exit("fewer than two pgbench connections sent END; in this capture")
    relayed, direct = sorted(firsts, key=firsts.get)[-2:]
    wal = lambda p: xlogdata_end(p) is not None
    show(f"relayed (pgbench :{relayed}), from END;", run(pk, prim, relayed, [
        ("primary: first XLogData", lambda p: p[1] == prim and p[2] != relayed and wal(p)),
        ("upstream: first bytes on the link", lambda p: p[1] == up),
        ("forwarder: first bytes down", lambda p: p[1] == fwd),
        ("downstream: XLogData to standby", lambda p: p[1] == down and wal(p)),
    ], (down, lambda p: True, down)))
    show(f"direct (pgbench :{direct}), from END;", run(pk, prim, direct, [
        ("primary: first XLogData", lambda p: p[1] == prim and p[2] != direct and wal(p)),
    ], (prim, lambda p: p[2] != direct, prim)))


if __name__ == "__main__":
    main()
