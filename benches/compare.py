#!/usr/bin/env python3
"""Reads the outputs of interleaved bench_e2e runs of two builds (compare.sh writes them as
<dir>/<build>-<round>.txt) and prints, per mode, each figure's median for both builds, the new
build against direct (the no-mesh baseline each run measures itself), and new against base per
round with its median: the ratios compare runs of the same round, on the same machine load."""
import re
import statistics
import sys
from pathlib import Path


def parse(path):
    """{mode title: {figure: (direct, ambit)}} of one run's output."""
    out, mode, figures = {}, None, False
    for line in path.read_text().splitlines():
        m = re.match(r"^### (.+)$", line)
        if m:
            mode = m.group(1)
            out[mode] = {}
            continue
        # Only the rows of a mode's figure table (the pod-start table of `ambit up` may follow
        # another mode's table, depending on the order of the modes).
        if not line.startswith("|"):
            figures = False
            continue
        if line.startswith("| Figure"):
            figures = True
            continue
        if mode is None or not figures or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) < 3:
            continue

        def num(c):
            c = c.replace("\u202f", "").replace(",", "").replace(" ", "")
            try:
                return float(c)
            except ValueError:
                return None

        out[mode][cells[0]] = (num(cells[1]), num(cells[2]))
    return out


def med(v):
    v = [x for x in v if x is not None]
    return statistics.median(v) if v else None


def fmt(x, d=2):
    return "—" if x is None else f"{x:.{d}f}"


def main():
    d = Path(sys.argv[1])
    rounds = sorted({int(p.stem.split("-")[1]) for p in d.glob("base-*.txt")})
    runs = {b: [parse(d / f"{b}-{r}.txt") for r in rounds] for b in ("base", "new")}
    for mode in runs["new"][0]:
        print(f"\n### {mode}\n")
        print("| Figure | Direct | Base | New | New / direct (range) | New / base per round (median) |")
        print("|---|---|---|---|---|---|")
        for fig in runs["new"][0][mode]:
            direct = [r[mode][fig][0] for r in runs["new"] if r.get(mode, {}).get(fig)]
            base = [r[mode][fig][1] for r in runs["base"] if r.get(mode, {}).get(fig)]
            new = [r[mode][fig][1] for r in runs["new"] if r.get(mode, {}).get(fig)]
            latency = "Latency" in fig
            if latency:
                vs_direct = [n - dd for n, dd in zip(new, direct) if n is not None and dd is not None]
                vd = f"+{fmt(med(vs_direct), 1)} µs ({fmt(min(vs_direct), 1)}–{fmt(max(vs_direct), 1)})" if vs_direct else "—"
            else:
                vs_direct = [n / dd for n, dd in zip(new, direct) if n is not None and dd]
                vd = f"{fmt(med(vs_direct))} ({fmt(min(vs_direct))}–{fmt(max(vs_direct))})" if vs_direct else "—"
            per = [n / b for n, b in zip(new, base) if n is not None and b]
            pr = " ".join(fmt(x) for x in per) + f" (**{fmt(med(per))}**)" if per else "—"
            print(f"| {fig} | {fmt(med(direct))} | {fmt(med(base))} | {fmt(med(new))} | {vd} | {pr} |")


if __name__ == "__main__":
    main()
