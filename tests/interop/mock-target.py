#!/usr/bin/env python3
"""Stand-in for `flashpool serve -c CONFIG`, used only to test the interop harness itself
(`tests/interop/run.sh run --mock-target`). It reads the listener ports from the TOML
config and relays every connection, byte for byte, to the guest's own kernel nvmet-tcp
(through QEMU hostfwd ports given in MOCK_UPSTREAM_IO / MOCK_UPSTREAM_DISC). It peeks at
the first PDUs (ICReq/ICResp, Connect/CapsuleResp) to print the stable log lines of
docs/config.md: listening on, controller N created/freed (host disconnected, keep-alive
timeout), host H not allowed on NQN, stopped cleanly."""
import os, signal, socket, struct, sys, threading, time, tomllib

cfg = tomllib.load(open(sys.argv[sys.argv.index("-c") + 1], "rb"))
UP = {"io": int(os.environ["MOCK_UPSTREAM_IO"]), "discovery": int(os.environ["MOCK_UPSTREAM_DISC"])}
lock = threading.Lock()
stop = threading.Event()


def log(msg):
    with lock:
        print("%s  INFO mock: %s" % (time.strftime("%H:%M:%S"), msg), flush=True)


class Relay:
    def __init__(self, c, kind):
        self.c, self.kind = c, kind
        self.u = socket.create_connection(("127.0.0.1", UP[kind]), timeout=10)
        self.u.settimeout(None)
        self.cbuf, self.ubuf = b"", b""
        self.qid = self.kato = self.cntlid = None
        self.subnqn = self.hostnqn = ""
        self.last_rx = time.time()
        self.closed = False
        self.reason = "connection error"
        threading.Thread(target=self.pump, args=(self.c, self.u, True), daemon=True).start()
        threading.Thread(target=self.pump, args=(self.u, self.c, False), daemon=True).start()

    def peek_cmd(self):  # ICReq (128) then the Connect CapsuleCmd
        b = self.cbuf
        if len(b) < 136:
            return
        plen = struct.unpack_from("<I", b, 132)[0]
        if len(b) < 128 + plen:
            return
        pdu = b[128:128 + plen]
        pdo = pdu[3]
        sqe = pdu[8:72]
        if sqe[0] == 0x7F and sqe[4] == 0x01:
            self.qid = struct.unpack_from("<H", sqe, 42)[0]
            self.kato = struct.unpack_from("<I", sqe, 48)[0]
            data = pdu[pdo:pdo + 1024] if pdo else b""
            z = lambda x: x.split(b"\0")[0].decode(errors="replace")
            if len(data) >= 768:
                self.subnqn, self.hostnqn = z(data[256:512]), z(data[512:768])
                if self.qid != 0:
                    self.cntlid = struct.unpack_from("<H", data, 16)[0]
        self.cbuf = None

    def peek_resp(self):  # ICResp (128) then the Connect CapsuleResp
        b = self.ubuf
        if self.qid is None or len(b) < 128 + 24:
            return
        dw0 = struct.unpack_from("<I", b, 136)[0]
        status = struct.unpack_from("<H", b, 128 + 8 + 14)[0] >> 1
        self.ubuf = None
        if status:
            if (status & 0xFF) == 0x84:
                log("host %s not allowed on %s" % (self.hostnqn, self.subnqn))
            return
        if self.qid != 0:
            return
        self.cntlid = dw0 & 0xFFFF
        activity[self.cntlid] = time.time()
        if self.qid == 0 and self.kind == "io" and not self.subnqn.endswith("discovery"):
            log("controller %d created: subsystem %s, host %s" % (self.cntlid, self.subnqn, self.hostnqn))

    def pump(self, src, dst, from_host):
        while not self.closed:
            try:
                d = src.recv(65536)
            except OSError:
                d = b""
            if not d:
                if from_host and not self.closed:
                    self.reason = "host disconnected"
                break
            if from_host:
                self.last_rx = time.time()
                if self.cntlid is not None:
                    activity[self.cntlid] = self.last_rx
                if self.cbuf is not None:
                    self.cbuf += d
                    self.peek_cmd()
            elif self.ubuf is not None:
                self.ubuf += d
                self.peek_resp()
            try:
                dst.sendall(d)
            except OSError:
                break
        self.close()

    def close(self, reason=None):
        with lock:
            if self.closed:
                return
            self.closed = True
        if reason:
            self.reason = reason
        for s in (self.c, self.u):
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass
        if self.qid == 0 and self.cntlid is not None and self.kind == "io" \
                and not self.subnqn.endswith("discovery"):
            log("controller %d freed: %s" % (self.cntlid, self.reason))


relays = []
activity = {}  # cntlid -> time of the last bytes from the host on any of its queues


def watchdog():
    while not stop.is_set():
        now = time.time()
        for r in list(relays):
            if not r.closed and r.qid == 0 and r.kato and r.cntlid is not None \
                    and now - activity.get(r.cntlid, now) > r.kato / 1000.0:
                for q in list(relays):
                    if q is not r and q.cntlid == r.cntlid and q.qid:
                        q.close()
                r.close("keep-alive timeout (%d ms)" % r.kato)
        time.sleep(0.2)


def serve(srv, kind):
    while not stop.is_set():
        try:
            c, _ = srv.accept()
        except OSError:
            continue
        try:
            relays.append(Relay(c, kind))
        except OSError as e:
            log("upstream connect failed: %r" % e)
            c.close()


listeners = cfg.get("listener") or [{"address": "127.0.0.1", "port": 4420, "kind": "io"},
                                    {"address": "127.0.0.1", "port": 8009, "kind": "discovery"}]
socks = []
for l in listeners:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((l["address"], l["port"]))
    s.listen(16)
    s.settimeout(0.5)
    socks.append(s)
    threading.Thread(target=serve, args=(s, l.get("kind", "io")), daemon=True).start()
    log("listening on %s:%d (%s)" % (l["address"], l["port"], l.get("kind", "io")))
threading.Thread(target=watchdog, daemon=True).start()


def on_term(*_):
    stop.set()


signal.signal(signal.SIGTERM, on_term)
signal.signal(signal.SIGINT, on_term)
while not stop.is_set():
    time.sleep(0.2)
for s in socks:
    s.close()
for r in list(relays):
    r.close("shutdown")
log("stopped cleanly")
