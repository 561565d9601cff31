#!/usr/bin/env python3
"""Who closes first, from a packet capture of close-per-request HTTP traffic (issue 27).

Reads `tcpdump -nn -tt -r <pcap>` text on stdin; SERVER is the server's IP (port 8080). Per
connection (keyed by the client's port): the first answer byte from the server, the server's
FIN and the client's FIN. Prints how many connections the client closed first and the gap from
the answer to the server's FIN (µs percentiles).

  ip netns exec <client netns> tcpdump -i any -nn -tt -s 96 -w /tmp/c.pcap tcp   # under load
  tcpdump -r /tmp/c.pcap -nn -tt | grep -v ' ifb0 .*15008' | python3 benches/fin_gap.py 10.244.2.2
"""
import re
import sys

LINE = re.compile(r'(\d+\.\d+) (?:\S+\s+\S+\s+)?IP (\S+) > (\S+): Flags \[([^\]]+)\].*length (\d+)')


def main() -> None:
    server = sys.argv[1] + '.8080'
    conns: dict[str, dict[str, float]] = {}
    for line in sys.stdin:
        m = LINE.match(line)
        if not m:
            continue
        t, src, dst, flags, length = float(m[1]), m[2], m[3].rstrip(':'), m[4], int(m[5])
        side = 's' if src.startswith(server) else 'c'
        port = (dst if side == 's' else src).rsplit('.', 1)[1]
        c = conns.setdefault(port, {})
        if side == 's' and length > 0:
            c.setdefault('data', t)
        if 'F' in flags:
            c.setdefault(side + 'fin', t)
    whole = [c for c in conns.values() if {'data', 'sfin', 'cfin'} <= c.keys()]
    gaps = sorted((c['sfin'] - c['data']) * 1e6 for c in whole)
    first = sum(1 for c in whole if c['cfin'] < c['sfin'])
    if not gaps:
        print('no whole connections in the capture')
        return
    q = lambda p: gaps[int(p * (len(gaps) - 1))]
    print(f'connections {len(whole)}, client closed first {first} ({100 * first / len(whole):.1f} %), '
          f'answer->server FIN us p10 {q(.1):.0f} p50 {q(.5):.0f} p90 {q(.9):.0f} p99 {q(.99):.0f}')


if __name__ == '__main__':
    main()
