#!/usr/bin/env python3
"""Where a synchronous commit's time goes through walrelay, hop by hop, from a packet capture
of `walrelay bench`'s sync-commit run (issue #12, docs/keeping-up.md, nineteenth round).

    tcpdump -i lo -s 96 -w cap.pcap tcp &
    WALRELAY_KEEP_TMP=1 walrelay bench --workload pgbench --cold-secs 3 --warmup-secs 1 \
        --steady-secs 3 --sync-secs 10
    kill %1
    # ports from the kept directory: the primary's `port`, and in w-upstream.toml /
    # w-downstream.toml the upstream's link `listen`, the downstream's `upstream` (the bench's
    # counting forwarder) and the downstream's `listen`
    scripts/sync-hops.py cap.pcap <primary> <upstream link> <forwarder> <downstream>

For each `END;` pgbench sends to the primary, it follows the commit's WAL and the standby's
reply along the path by the first packet carrying data on each socket after the one before:
primary -> upstream -> forwarder -> downstream -> standby -> downstream -> forwarder ->
upstream -> primary -> pgbench. Then, per pgbench connection (the relayed run, then the
direct one), the median time from END to the primary's answer. Timestamps are tcpdump's, on
one host: each hop includes the wake-ups of whatever reads and writes the sockets.
Standard library only.
"""
import statistics
import struct
import sys


def packets(path):
    """(time, src port, dst port, payload head) of each TCP packet carrying data (IPv4)."""
    out = []
    with open(path, "rb") as f:
        head = f.read(24)
        nano = struct.unpack("<I", head[:4])[0] == 0xA1B23C4D
        link = struct.unpack("<I", head[20:24])[0]
        off = 14 if link == 1 else 16
        while True:
            h = f.read(16)
            if len(h) < 16:
                return out
            sec, frac, incl, _ = struct.unpack("<IIII", h)
            d = f.read(incl)
            if len(d) < off + 20 or d[off] >> 4 != 4:
                continue
            ip = d[off:]
            ihl = (ip[0] & 15) * 4
            total = struct.unpack(">H", ip[2:4])[0]
            tcp = ip[ihl:]
            if len(tcp) < 14:
                continue
            sport, dport = struct.unpack(">HH", tcp[:4])
            doff = (tcp[12] >> 4) * 4
            if total - ihl - doff <= 0:
                continue
            t = sec + frac / (1e9 if nano else 1e6)
            out.append((t, sport, dport, tcp[doff : doff + 16]))


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    pk = packets(sys.argv[1])
    prim, up, fwd, down = map(int, sys.argv[2:6])
    ends = [i for i, p in enumerate(pk) if p[2] == prim and p[3][:1] == b"Q" and b"END;" in p[3]]

    def after(i, cond, lim):
        for j in range(i + 1, lim):
            if cond(pk[j]):
                return j
        return None

    names = ["primary -> upstream", "forwarder -> downstream", "downstream -> standby",
             "standby's reply", "downstream -> forwarder", "forwarder -> upstream",
             "upstream -> primary", "primary -> pgbench", "END -> answer"]
    hops = {n: [] for n in names}
    runs = {}
    for k, i in enumerate(ends):
        pg = pk[i][1]
        lim = ends[k + 1] if k + 1 < len(ends) else len(pk)
        answer = after(i, lambda p: p[1] == prim and p[2] == pg, lim)
        if answer is None:
            continue
        runs.setdefault(pg, []).append((pk[answer][0] - pk[i][0]) * 1e6)
        a = after(i, lambda p: p[1] == up, answer)
        if a is None:
            continue
        sent = next((j for j in range(a - 1, i, -1) if pk[j][1] == prim and pk[j][2] != pg), None)
        chain = [sent, a]
        for cond in (lambda p: p[1] == fwd, lambda p: p[1] == down, lambda p: p[2] == down,
                     lambda p: p[2] == fwd, lambda p: p[2] == up,
                     lambda p: p[2] == prim and p[1] != pg):
            chain.append(after(chain[-1], cond, answer) if chain[-1] is not None else None)
        if None in chain:
            continue
        chain.append(answer)
        t = [pk[j][0] for j in chain]
        for n, x, y in zip(names, t, t[1:]):
            hops[n].append((y - x) * 1e6)
        hops["END -> answer"].append((pk[answer][0] - pk[i][0]) * 1e6)
    for n in names:
        if hops[n]:
            v = hops[n]
            print(f"{n:24s} n={len(v):6d}  p50 {statistics.median(v):7.1f} us  mean {statistics.mean(v):7.1f} us")
    for pg, v in runs.items():
        print(f"pgbench connection :{pg}: {len(v)} commits, END -> answer p50 {statistics.median(v):.1f} us")


if __name__ == "__main__":
    main()
