#!/usr/bin/env python3
"""Medians and ratios of docs/bench/spdk-vs.sh output: docs/bench/spdk-vs-summary.py out.txt"""
import re,sys,statistics as st
rows={}
for l in open(sys.argv[1]):
    m=re.match(r"RES round=(\d+) tgt=(\w+) wl=(\d) iops_lat=([\d.]+) ([\d.]+)",l)
    if not m: continue
    r,t,w,i,lat=m.groups(); rows.setdefault((int(w),t),[]).append((int(r),float(i),float(lat)))
names=["4K randread QD1 (mean us)","4K randread QD32","4K randwrite QD32","128K read QD16","128K write QD16"]
for w in range(5):
    med={}
    for t in ["spdk","default","poll0"]:
        v=rows.get((w,t),[])
        x=[lat for _,_,lat in v] if w==0 else [i for _,i,_ in v]
        med[t]=st.median(x) if x else float('nan')
        rng=f"[{min(x):.0f}-{max(x):.0f}]" if x else ""
        print(f"{names[w]:28} {t:8} median {med[t]:10.1f} {rng} n={len(x)}")
    if w==0: print(f"   default/spdk latency ratio {med['default']/med['spdk']:.2f}")
    else:
        print(f"   default/spdk {med['default']/med['spdk']:.2f}  poll0/spdk {med['poll0']/med['spdk']:.2f}  default/poll0 {med['default']/med['poll0']:.2f}")
        # per-round default/poll0
        d={r:i for r,i,_ in rows[(w,'default')]}; p={r:i for r,i,_ in rows[(w,'poll0')]}
        print("   per-round default/poll0:", " ".join(f"{d[r]/p[r]:.2f}" for r in sorted(d) if r in p))
