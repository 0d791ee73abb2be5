#!/usr/bin/env python3
"""tests/failover/timeline.py -- one fault case's events from every side on one clock.

The host stamps every serial line of the guest with its arrival time (EPOCH TEXT), the
harness logs its own actions the same way (events.log), and the nodes log RFC 3339 UTC
times (tracing), etcd 3.4 "YYYY-MM-DD HH:MM:SS.ffffff" local times. Prints the lines in
[FROM, TO] sorted, as seconds relative to T0 (the fault), with where each came from:

  timeline.py --t0 T --from A --to B --events events.log --serial serial.log \
      [--node c1=c1.log ...] [--etcd m1=etcd-1.log ...] [--title TEXT]
"""
import argparse
import datetime
import re
import time

NODE_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)Z\s+(\S+)\s+(.*)$")
ETCD_TS = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) (\S) \| (.*)$")
# node log lines too frequent to help a timeline
NODE_SKIP = re.compile(r"Attach a Linux host|modprobe nvme-tcp|nvme discover -t tcp|^\s")
# guest serial lines worth a place: kernel (@@K), I/O stalls (@@IO), the init's own log,
# RESULT lines; not the per-marker chatter
SERIAL_KEEP = re.compile(r"^(@@K |@@IO |@@ \[|RESULT |@@HOST )")
ETCD_KEEP = re.compile(r"elected leader|became leader|lost leader|became candidate|"
                       r"starting a new election|leader changed|no leader|ready to serve")


def utc(s):
    for fmt in ("%Y-%m-%dT%H:%M:%S.%f", "%Y-%m-%dT%H:%M:%S"):
        try:
            return datetime.datetime.strptime(s, fmt).replace(
                tzinfo=datetime.timezone.utc).timestamp()
        except ValueError:
            pass
    return None


def local(s):
    for fmt in ("%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S"):
        try:
            return time.mktime(datetime.datetime.strptime(s, fmt).timetuple()) + \
                (float("0." + s.split(".")[1]) if "." in s else 0.0)
        except ValueError:
            pass
    return None


def stamped(path, who):
    """EPOCH TEXT lines (serial.log, events.log)."""
    out = []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                t, _, text = line.rstrip("\n").partition(" ")
                try:
                    t = float(t)
                except ValueError:
                    continue
                if who == "guest":
                    if not SERIAL_KEEP.match(text):
                        continue
                    if text.startswith("@@K "):
                        # "@@K 6,1234,56789012,-;nvme nvme0: ..." -> kernel time, message
                        m = re.match(r"@@K \d+,\d+,(\d+),[^;]*;(.*)", text)
                        if m:
                            text = "[%12.6f] %s" % (int(m.group(1)) / 1e6, m.group(2))
                        out.append((t, "kernel", text))
                        continue
                    if text.startswith("@@IO "):
                        out.append((t, "guest-io", text[5:]))
                        continue
                out.append((t, who, text))
    except OSError:
        pass
    return out


def node_log(path, who):
    out = []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                line = line.rstrip("\n")
                m = NODE_TS.match(line)
                if not m or NODE_SKIP.search(m.group(3)):
                    continue
                t = utc(m.group(1))
                if t is not None:
                    out.append((t, who, "%-5s %s" % (m.group(2), m.group(3))))
    except OSError:
        pass
    return out


def etcd_log(path, who):
    out = []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                m = ETCD_TS.match(line.rstrip("\n"))
                if not m or not ETCD_KEEP.search(m.group(3)):
                    continue
                t = local(m.group(1))
                if t is not None:
                    out.append((t, who, m.group(3)))
    except OSError:
        pass
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--t0", type=float, required=True)
    p.add_argument("--from", dest="frm", type=float, required=True)
    p.add_argument("--to", type=float, required=True)
    p.add_argument("--events")
    p.add_argument("--serial")
    p.add_argument("--node", action="append", default=[])
    p.add_argument("--etcd", action="append", default=[])
    p.add_argument("--title", default="")
    a = p.parse_args()
    ev = []
    if a.events:
        ev += stamped(a.events, "host")
    if a.serial:
        ev += stamped(a.serial, "guest")
    for spec in a.node:
        who, _, path = spec.partition("=")
        ev += node_log(path, who)
    for spec in a.etcd:
        who, _, path = spec.partition("=")
        ev += etcd_log(path, who)
    ev = sorted(e for e in ev if a.frm <= e[0] <= a.to)
    t0 = datetime.datetime.fromtimestamp(a.t0, datetime.timezone.utc)
    print("== %s (t=0: %s UTC)" % (a.title, t0.strftime("%H:%M:%S.%f")[:-3]))
    for t, who, text in ev:
        print("%+8.3f %-8s %s" % (t - a.t0, who, text))


if __name__ == "__main__":
    main()
