//! A controller association: the admin queue, its bring-up (Connect,
//! Property Get/Set, Identify, Set Features), keep-alive, the I/O queues,
//! and a clean shutdown.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use blockdev::AlignedBuf;
use nvme_wire::fabrics::{
    CATTR_DISABLE_SQFLOW, CNTLID_DYNAMIC, ConnectCmd, ConnectData, PropertyCmd, discovery, fctype,
    prop,
};
use nvme_wire::identify::{IDENTIFY_LEN, cns};
use nvme_wire::log_page::{GetLogPage, lid};
use nvme_wire::sqe::{Sqe, admin_opc};
use nvme_wire::status;
use parking_lot::{Mutex, RwLock};
use tokio::task::JoinHandle;

use crate::error::{CmdStatus, HostError, Result};
use crate::identify::{ControllerInfo, NamespaceInfo, parse_ns_list};
use crate::io::IoQueue;
use crate::options::{HostOptions, check_options, tls_channel};
use crate::queue::{Queue, buf_from, zeroed_buf};
use crate::slot::{DataDir, QueueParams, Response};

/// Admin queue depth we ask for (the Linux host's too).
pub const ADMIN_QUEUE_DEPTH: u16 = 32;
/// In-capsule data every NVMe/TCP controller takes on the admin queue.
const ADMIN_IN_CAPSULE: u32 = 8192;
/// Set Features feature id: Number of Queues.
const FID_NUM_QUEUES: u32 = 0x07;
const CC_SHN_NORMAL: u32 = 1 << prop::CC_SHN_SHIFT;
const CSTS_SHST_MASK: u32 = 3 << 2;
/// Largest Get Log Page transfer we ask for at once.
const LOG_CHUNK: u64 = 256 * 1024;

/// A connected controller.
pub struct Controller {
    addr: SocketAddr,
    subnqn: String,
    opts: HostOptions,
    admin: Arc<Queue>,
    cntlid: u16,
    cap: u64,
    vs: u32,
    cc: u32,
    info: ControllerInfo,
    granted_io_queues: u16,
    io_depth: u16,
    io_queues: RwLock<Vec<Option<Arc<IoQueue>>>>,
    keep_alive: Mutex<Option<JoinHandle<()>>>,
}

impl Controller {
    /// Connects the admin queue, enables the controller, identifies it, asks
    /// for the I/O queues and (unless `lazy_io_queues`) connects them. Call
    /// inside a tokio runtime with I/O and time enabled; the connection and
    /// keep-alive tasks run on it.
    pub async fn connect(addr: SocketAddr, subnqn: &str, opts: HostOptions) -> Result<Controller> {
        check_options(subnqn, &opts)?;
        let t0 = Instant::now();
        let admin = Arc::new(
            Queue::connect(QueueParams {
                addr,
                qid: 0,
                depth: ADMIN_QUEUE_DEPTH,
                hdr_digest: opts.hdr_digest,
                data_digest: opts.data_digest,
                timeout: opts.timeout,
                icd_limit: ADMIN_IN_CAPSULE,
                poll: Duration::ZERO,
                pdu_per_write: false,
                tls: tls_channel(&opts, subnqn),
            })
            .await?,
        );
        let t_tcp = t0.elapsed();
        let cntlid =
            fabrics_connect(&admin, 0, CNTLID_DYNAMIC, subnqn, &opts, opts.kato_ms, 0).await?;
        let t_connect = t0.elapsed();
        let (cap, vs) = tokio::join!(
            property_get(&admin, prop::CAP, true),
            property_get(&admin, prop::VS, false)
        );
        let (cap, vs) = (cap?, vs? as u32);
        let cc = prop::CC_EN | (6 << prop::CC_IOSQES_SHIFT) | (4 << prop::CC_IOCQES_SHIFT);
        property_set(&admin, prop::CC, cc).await?;
        // CAP.TO: worst-case time to become ready, 500 ms units.
        let ready_within = Duration::from_millis(((cap >> 24) & 0xFF).max(1) * 500);
        wait_csts(&admin, "enable (CC.EN = 1)", ready_within, |csts| {
            csts & prop::CSTS_RDY != 0
        })
        .await?;
        let t_enable = t0.elapsed();
        let (buf, _) = admin_cmd(
            &admin,
            identify_sqe(cns::CONTROLLER, 0),
            DataDir::ToHost,
            zeroed_buf(IDENTIFY_LEN),
            || "Identify Controller".into(),
        )
        .await?;
        let info = ControllerInfo::parse(&buf).ok_or_else(|| HostError::Protocol {
            addr,
            msg: "Identify Controller returned a short structure".into(),
        })?;
        let mqes = (cap & 0xFFFF) as u32 + 1;
        let mut io_depth = u32::from(opts.queue_depth).min(mqes);
        if info.maxcmd > 0 {
            io_depth = io_depth.min(u32::from(info.maxcmd));
        }
        let io_depth = io_depth.max(2) as u16;
        let granted = if opts.nr_io_queues > 0
            && info.cntrltype != nvme_wire::identify::CNTRLTYPE_DISCOVERY
        {
            set_num_queues(&admin, opts.nr_io_queues).await?
        } else {
            0
        };
        let t_ident = t0.elapsed();
        if granted < opts.nr_io_queues {
            tracing::warn!(
                "{addr}: asked for {} I/O queues, the controller grants {granted}",
                opts.nr_io_queues
            );
        }
        let ctrl = Controller {
            addr,
            subnqn: subnqn.to_string(),
            keep_alive: Mutex::new(None),
            io_queues: RwLock::new((0..granted).map(|_| None).collect()),
            granted_io_queues: granted,
            io_depth,
            info,
            cntlid,
            cap,
            vs,
            cc,
            admin,
            opts,
        };
        if ctrl.opts.kato_ms > 0 {
            *ctrl.keep_alive.lock() = Some(spawn_keep_alive(
                Arc::downgrade(&ctrl.admin),
                ctrl.opts.kato_ms,
            ));
        }
        if !ctrl.opts.lazy_io_queues {
            // All at once: each is its own TCP connection, ICReq and Connect.
            let n = granted.min(ctrl.opts.nr_io_queues);
            let added = futures_util::future::join_all((1..=n).map(|q| ctrl.add_io_queue(q))).await;
            for r in added {
                r?;
            }
        }
        tracing::debug!(
            "{addr}: controller steps: admin TCP+ICReq {t_tcp:?}, Connect {:?}, enable {:?}, \
             identify+queues {:?}, I/O queues {:?}",
            t_connect - t_tcp,
            t_enable - t_connect,
            t_ident - t_enable,
            t0.elapsed() - t_ident
        );
        Ok(ctrl)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
    pub fn subnqn(&self) -> &str {
        &self.subnqn
    }
    pub fn options(&self) -> &HostOptions {
        &self.opts
    }
    pub fn cntlid(&self) -> u16 {
        self.cntlid
    }
    /// Controller Capabilities (CAP).
    pub fn cap(&self) -> u64 {
        self.cap
    }
    /// Version (VS), e.g. 0x00010300 for 1.3.
    pub fn version(&self) -> u32 {
        self.vs
    }
    pub fn info(&self) -> &ControllerInfo {
        &self.info
    }
    /// I/O queues the controller granted.
    pub fn granted_io_queues(&self) -> u16 {
        self.granted_io_queues
    }
    /// Commands in flight per I/O queue.
    pub fn io_queue_depth(&self) -> u16 {
        self.io_depth
    }
    /// MAXH2CDATA and digests of the admin connection (I/O connections negotiate the same).
    pub fn max_h2c_data(&self) -> u32 {
        self.admin.negotiated().maxh2cdata
    }
    pub fn digests(&self) -> (bool, bool) {
        let n = self.admin.negotiated();
        (n.hdgst, n.ddgst)
    }

    /// Connects I/O queue `qid` (1..=granted) on the calling runtime: its
    /// connection task runs there, so a thread-per-core caller keeps each
    /// queue on its own thread.
    pub async fn add_io_queue(&self, qid: u16) -> Result<Arc<IoQueue>> {
        self.add_io_queue_on(qid, None).await
    }

    /// Connects I/O queue `qid` with its connection task (and its socket) on
    /// `runtime`, or on the calling one: a queue on a reactor's runtime runs
    /// on the thread that submits to it, with no wake-up of another thread
    /// per command.
    pub async fn add_io_queue_on(
        &self,
        qid: u16,
        runtime: Option<&tokio::runtime::Handle>,
    ) -> Result<Arc<IoQueue>> {
        if qid == 0 || qid > self.granted_io_queues {
            return Err(HostError::Invalid(format!(
                "I/O queue id {qid} is out of range; the controller granted queues 1..={}",
                self.granted_io_queues
            )));
        }
        if self.io_queues.read()[usize::from(qid - 1)].is_some() {
            return Err(HostError::Invalid(format!(
                "I/O queue {qid} is already connected"
            )));
        }
        let p = QueueParams {
            addr: self.addr,
            qid,
            depth: self.io_depth,
            hdr_digest: self.opts.hdr_digest,
            data_digest: self.opts.data_digest,
            timeout: self.opts.timeout,
            icd_limit: self
                .opts
                .in_capsule_max
                .map_or(self.info.in_capsule_data(), |m| {
                    m.min(self.info.in_capsule_data())
                }),
            poll: Duration::from_micros(u64::from(self.opts.poll_us)),
            pdu_per_write: self.opts.pdu_per_write,
            tls: tls_channel(&self.opts, &self.subnqn),
        };
        let q = match runtime {
            None => Queue::connect(p).await?,
            Some(rt) => rt.spawn(Queue::connect(p)).await.map_err(|e| {
                HostError::Invalid(format!(
                    "I/O queue {qid}: its runtime did not run the connect: {e}"
                ))
            })??,
        };
        let cattr = if self.opts.disable_sqflow {
            CATTR_DISABLE_SQFLOW
        } else {
            0
        };
        fabrics_connect(&q, qid, self.cntlid, &self.subnqn, &self.opts, 0, cattr).await?;
        let q = Arc::new(IoQueue::new(q, qid));
        let mut list = self.io_queues.write();
        if list[usize::from(qid - 1)].is_some() {
            return Err(HostError::Invalid(format!(
                "I/O queue {qid} is already connected"
            )));
        }
        list[usize::from(qid - 1)] = Some(q.clone());
        Ok(q)
    }

    /// A connected I/O queue.
    /// Re-authenticates the admin queue and every connected I/O queue
    /// (a new DH-HMAC-CHAP transaction on each, as Linux does when its
    /// secret changes). Fails when no secret is configured.
    pub async fn reauthenticate(&self) -> Result<()> {
        let Some(keys) = &self.opts.dhchap else {
            return Err(HostError::Invalid(
                "no DH-HMAC-CHAP secret configured (HostOptions::dhchap)".into(),
            ));
        };
        let (host, sub) = (&self.opts.hostnqn, &self.subnqn);
        crate::auth::authenticate(&self.admin, 0, host, sub, keys).await?;
        let queues: Vec<_> = self.io_queues.read().iter().flatten().cloned().collect();
        for q in queues {
            crate::auth::authenticate(q.queue(), q.qid(), host, sub, keys).await?;
        }
        Ok(())
    }

    pub fn io_queue(&self, qid: u16) -> Result<Arc<IoQueue>> {
        let list = self.io_queues.read();
        qid.checked_sub(1)
            .and_then(|i| list.get(usize::from(i)))
            .and_then(Clone::clone)
            .ok_or_else(|| {
                HostError::Invalid(format!(
                    "I/O queue {qid} is not connected (connected: {:?})",
                    list.iter()
                        .enumerate()
                        .filter(|(_, q)| q.is_some())
                        .map(|(i, _)| i + 1)
                        .collect::<Vec<_>>()
                ))
            })
    }

    /// Reads `nlb` blocks from `slba` into `buf` (its length: `nlb` times the LBA size).
    pub async fn read(
        &self,
        qid: u16,
        nsid: u32,
        slba: u64,
        nlb: u32,
        buf: &mut [u8],
    ) -> Result<()> {
        self.io_queue(qid)?.read(nsid, slba, nlb, buf).await
    }

    /// Writes `buf` (`nlb` times the LBA size) at `slba`.
    pub async fn write(&self, qid: u16, nsid: u32, slba: u64, nlb: u32, buf: &[u8]) -> Result<()> {
        self.io_queue(qid)?.write(nsid, slba, nlb, buf).await
    }

    pub async fn flush(&self, qid: u16, nsid: u32) -> Result<()> {
        self.io_queue(qid)?.flush(nsid).await
    }

    pub async fn write_zeroes(&self, qid: u16, nsid: u32, slba: u64, nlb: u32) -> Result<()> {
        self.io_queue(qid)?.write_zeroes(nsid, slba, nlb).await
    }

    /// Dataset Management with Deallocate over `(slba, nlb)` ranges.
    pub async fn deallocate(&self, qid: u16, nsid: u32, ranges: &[(u64, u32)]) -> Result<()> {
        self.io_queue(qid)?.deallocate(nsid, ranges).await
    }

    /// Identify Namespace: size and LBA format of an active namespace.
    pub async fn identify_namespace(&self, nsid: u32) -> Result<NamespaceInfo> {
        let (buf, _) = admin_cmd(
            &self.admin,
            identify_sqe(cns::NAMESPACE, nsid),
            DataDir::ToHost,
            zeroed_buf(IDENTIFY_LEN),
            || format!("Identify Namespace {nsid}"),
        )
        .await?;
        NamespaceInfo::parse(nsid, &buf).ok_or_else(|| {
            HostError::Invalid(format!(
                "namespace {nsid} is not active on {} (Identify Namespace returned no size or LBA format)",
                self.subnqn
            ))
        })
    }

    /// The NS ID descriptor list (Identify CNS 0x03): `(NIDT, NID)` pairs,
    /// e.g. `(nvme_wire::identify::nidt::UUID, 16 bytes)`.
    pub async fn ns_descriptors(&self, nsid: u32) -> Result<Vec<(u8, Vec<u8>)>> {
        let (buf, _) = admin_cmd(
            &self.admin,
            identify_sqe(cns::NS_ID_DESCRIPTORS, nsid),
            DataDir::ToHost,
            zeroed_buf(IDENTIFY_LEN),
            || format!("Identify Namespace Identification Descriptors, namespace {nsid}"),
        )
        .await?;
        let list =
            nvme_wire::identify::decode_ns_descriptors(&buf).map_err(|e| HostError::Protocol {
                addr: self.addr,
                msg: format!("bad NS ID descriptor list for namespace {nsid}: {e}"),
            })?;
        Ok(list.into_iter().map(|(t, id)| (t, id.to_vec())).collect())
    }

    /// The error that ended the admin connection (keep-alive or a command
    /// timed out, the target went away), if it ended.
    pub fn error(&self) -> Option<HostError> {
        self.admin.dead()
    }

    /// Active namespace IDs (Identify CNS 0x02), ascending.
    pub async fn active_namespaces(&self) -> Result<Vec<u32>> {
        let (buf, _) = admin_cmd(
            &self.admin,
            identify_sqe(cns::ACTIVE_NS_LIST, 0),
            DataDir::ToHost,
            zeroed_buf(IDENTIFY_LEN),
            || "Identify Active Namespace List".into(),
        )
        .await?;
        Ok(parse_ns_list(&buf))
    }

    /// Get Log Page: `len` bytes of log `lid` from byte `offset`, in pieces the controller takes.
    pub async fn get_log_page(&self, log: u8, len: u64, offset: u64) -> Result<Vec<u8>> {
        let chunk = self.info.max_transfer().unwrap_or(LOG_CHUNK).min(LOG_CHUNK);
        let mut out = Vec::with_capacity(len as usize);
        let mut at = 0;
        while at < len {
            let n = (len - at).min(chunk);
            let g = GetLogPage {
                lid: log,
                lsp: 0,
                rae: false,
                len: n,
                offset: offset + at,
            };
            let (buf, _) = admin_cmd(
                &self.admin,
                g.to_sqe(0),
                DataDir::ToHost,
                zeroed_buf(n as usize),
                || {
                    format!(
                        "Get Log Page {log:#04x} bytes {}..{}",
                        offset + at,
                        offset + at + n
                    )
                },
            )
            .await?;
            out.extend_from_slice(&buf);
            at += n;
        }
        Ok(out)
    }

    /// The discovery log: the header first, then all records; again if it changed meanwhile.
    pub async fn discovery_log(&self) -> Result<Vec<discovery::Entry>> {
        let le64 =
            |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        for _ in 0..3 {
            let hdr = self
                .get_log_page(lid::DISCOVERY, discovery::HEADER_LEN as u64, 0)
                .await?;
            let (genctr, numrec) = (le64(&hdr, 0), le64(&hdr, 8));
            if numrec > 4096 {
                return Err(HostError::Protocol {
                    addr: self.addr,
                    msg: format!("the discovery log claims {numrec} records"),
                });
            }
            let len = numrec * discovery::ENTRY_LEN as u64;
            let body = self
                .get_log_page(lid::DISCOVERY, len, discovery::HEADER_LEN as u64)
                .await?;
            let again = self
                .get_log_page(lid::DISCOVERY, discovery::HEADER_LEN as u64, 0)
                .await?;
            if le64(&again, 0) != genctr {
                continue;
            }
            return body
                .chunks_exact(discovery::ENTRY_LEN)
                .map(|e| {
                    discovery::Entry::decode(e).map_err(|e| HostError::Protocol {
                        addr: self.addr,
                        msg: format!("bad discovery log entry: {e}"),
                    })
                })
                .collect();
        }
        Err(HostError::Protocol {
            addr: self.addr,
            msg: "the discovery log kept changing while it was read (GENCTR)".into(),
        })
    }

    /// Sends one Keep Alive now.
    pub async fn keep_alive(&self) -> Result<()> {
        admin_cmd(
            &self.admin,
            Sqe::new(admin_opc::KEEP_ALIVE, 0),
            DataDir::None,
            AlignedBuf::empty(),
            || "Keep Alive".into(),
        )
        .await
        .map(|_| ())
    }

    /// Clean disconnect: closes the I/O queues, shuts the controller down
    /// (CC.SHN = normal, then CSTS.SHST = complete), closes the admin queue.
    pub async fn disconnect(self) -> Result<()> {
        if let Some(k) = self.keep_alive.lock().take() {
            k.abort();
        }
        let queues: Vec<_> = self
            .io_queues
            .write()
            .iter_mut()
            .filter_map(Option::take)
            .collect();
        for q in &queues {
            q.close_and_wait().await;
        }
        let r = async {
            property_set(&self.admin, prop::CC, self.cc | CC_SHN_NORMAL).await?;
            wait_csts(
                &self.admin,
                "shutdown (CC.SHN = normal)",
                self.opts.timeout,
                |csts| csts & CSTS_SHST_MASK == prop::CSTS_SHST_COMPLETE,
            )
            .await
        }
        .await;
        self.admin.close_and_wait().await;
        r
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if let Some(k) = self.keep_alive.lock().take() {
            k.abort();
        }
        // The queues close when their last handle goes.
    }
}

fn identify_sqe(cns: u8, nsid: u32) -> Sqe {
    let mut s = Sqe::new(admin_opc::IDENTIFY, 0);
    s.nsid = nsid;
    s.cdw10 = u32::from(cns);
    s
}

/// Runs an admin command; a failed status becomes an error naming `what`.
async fn admin_cmd(
    q: &Queue,
    sqe: Sqe,
    dir: DataDir,
    buf: AlignedBuf,
    what: impl FnOnce() -> String,
) -> Result<(AlignedBuf, Response)> {
    let fabrics = sqe.is_fabrics();
    let (buf, r) = q.execute(sqe, dir, buf).await;
    let r = r?;
    if !r.status.is_success() {
        return Err(HostError::Status {
            addr: q.params().addr,
            what: what(),
            status: CmdStatus {
                status: r.status,
                fabrics,
            },
        });
    }
    Ok((buf, r))
}

/// Fabrics Connect on queue `qid`; returns the controller id.
async fn fabrics_connect(
    q: &Queue,
    qid: u16,
    cntlid: u16,
    subnqn: &str,
    o: &HostOptions,
    kato_ms: u32,
    cattr: u8,
) -> Result<u16> {
    let cmd = ConnectCmd {
        recfmt: 0,
        qid,
        sqsize: q.params().depth - 1,
        cattr,
        kato_ms,
    };
    let data = ConnectData {
        hostid: o.hostid,
        cntlid,
        subnqn: subnqn.to_string(),
        hostnqn: o.hostnqn.clone(),
    }
    .encode();
    let (_, r) = q
        .execute(cmd.to_sqe(0), DataDir::InCapsule, buf_from(&data))
        .await;
    let r = r?;
    if !r.status.is_success() {
        return Err(connect_error(q.params().addr, qid, r, subnqn, &o.hostnqn));
    }
    if r.dw0 & nvme_wire::auth::CONNECT_AUTHREQ_ATR != 0 {
        let Some(keys) = &o.dhchap else {
            return Err(HostError::Authentication {
                addr: q.params().addr,
                qid,
                why: format!(
                    "subsystem {subnqn} requires DH-HMAC-CHAP of host {}; configure its secret",
                    o.hostnqn
                ),
            });
        };
        crate::auth::authenticate(q, qid, &o.hostnqn, subnqn, keys).await?;
    }
    Ok(r.dw0 as u16)
}

/// Turns a refused Connect into the error that says why.
pub(crate) fn connect_error(
    addr: SocketAddr,
    qid: u16,
    r: Response,
    subnqn: &str,
    hostnqn: &str,
) -> HostError {
    use nvme_wire::fabrics::{
        CONNECT_DATA_OFF_CNTLID, CONNECT_DATA_OFF_HOSTNQN, CONNECT_DATA_OFF_SUBNQN,
        CONNECT_SQE_OFF_QID, CONNECT_SQE_OFF_SQSIZE,
    };
    let st = r.status;
    match (st.sct, st.sc) {
        (status::SCT_CMD_SPECIFIC, status::SC_CONNECT_INVALID_PARAM) => {
            // Dword 0: IPO (byte offset of the field) in bits 15:0, IATTR in bits 23:16
            // (bit 16 set: the offset is in the Connect data, else in the SQE).
            let ipo = r.dw0 as u16;
            let in_data = (r.dw0 >> 16) & 1 != 0;
            if in_data && ipo == CONNECT_DATA_OFF_SUBNQN {
                return HostError::UnknownSubsystem {
                    addr,
                    subnqn: subnqn.to_string(),
                };
            }
            let field = match (in_data, ipo) {
                (true, 0) => "HOSTID",
                (true, CONNECT_DATA_OFF_CNTLID) => "CNTLID (the controller may be gone)",
                (true, CONNECT_DATA_OFF_HOSTNQN) => "HOSTNQN",
                (false, CONNECT_SQE_OFF_QID) => "QID",
                (false, CONNECT_SQE_OFF_SQSIZE) => {
                    "SQSIZE (queue depth over the controller's limit?)"
                }
                _ => "an unnamed field",
            };
            HostError::ConnectInvalidParameter {
                addr,
                place: format!(
                    "{} offset {ipo}: {field} (queue {qid})",
                    if in_data {
                        "Connect data"
                    } else {
                        "the Connect command"
                    }
                ),
            }
        }
        (status::SCT_CMD_SPECIFIC, status::SC_CONNECT_INVALID_HOST) => HostError::HostNotAllowed {
            addr,
            hostnqn: hostnqn.to_string(),
            subnqn: subnqn.to_string(),
        },
        _ => HostError::Status {
            addr,
            what: format!("Connect (queue {qid}, subsystem {subnqn})"),
            status: CmdStatus {
                status: st,
                fabrics: true,
            },
        },
    }
}

async fn property_get(q: &Queue, offset: u32, size8: bool) -> Result<u64> {
    let sqe = PropertyCmd {
        size8,
        offset,
        value: 0,
    }
    .to_sqe(fctype::PROPERTY_GET, 0);
    let (_, r) = admin_cmd(q, sqe, DataDir::None, AlignedBuf::empty(), || {
        format!("Property Get {offset:#x}")
    })
    .await?;
    Ok(u64::from(r.dw0) | (u64::from(r.dw1) << 32))
}

async fn property_set(q: &Queue, offset: u32, value: u32) -> Result<()> {
    let sqe = PropertyCmd {
        size8: false,
        offset,
        value: u64::from(value),
    }
    .to_sqe(fctype::PROPERTY_SET, 0);
    admin_cmd(q, sqe, DataDir::None, AlignedBuf::empty(), || {
        format!("Property Set {offset:#x} = {value:#x}")
    })
    .await
    .map(|_| ())
}

/// Polls CSTS until `done` holds; CSTS.CFS ends the wait with an error.
async fn wait_csts(
    q: &Queue,
    when: &'static str,
    within: Duration,
    done: impl Fn(u32) -> bool,
) -> Result<()> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(100);
    loop {
        let csts = property_get(q, prop::CSTS, false).await? as u32;
        if done(csts) {
            return Ok(());
        }
        if csts & prop::CSTS_CFS != 0 {
            return Err(HostError::ControllerFatal {
                addr: q.params().addr,
                when,
            });
        }
        if start.elapsed() > within {
            return Err(HostError::Timeout {
                addr: q.params().addr,
                what: format!("controller {when}: CSTS stayed {csts:#x}"),
                after: within,
            });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Set Features Number of Queues; returns how many I/O queues were granted.
async fn set_num_queues(q: &Queue, n: u16) -> Result<u16> {
    let mut sqe = Sqe::new(admin_opc::SET_FEATURES, 0);
    sqe.cdw10 = FID_NUM_QUEUES;
    let v = u32::from(n - 1);
    sqe.cdw11 = v | (v << 16);
    let (_, r) = admin_cmd(q, sqe, DataDir::None, AlignedBuf::empty(), || {
        format!("Set Features Number of Queues ({n})")
    })
    .await?;
    let nsqa = (r.dw0 & 0xFFFF) + 1;
    let ncqa = (r.dw0 >> 16) + 1;
    Ok(nsqa.min(ncqa).min(u32::from(n)) as u16)
}

fn spawn_keep_alive(admin: Weak<Queue>, kato_ms: u32) -> JoinHandle<()> {
    let every = Duration::from_millis(u64::from(kato_ms / 2)).max(Duration::from_millis(100));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let Some(q) = admin.upgrade() else { return };
            let r = admin_cmd(
                &q,
                Sqe::new(admin_opc::KEEP_ALIVE, 0),
                DataDir::None,
                AlignedBuf::empty(),
                || "Keep Alive".into(),
            )
            .await;
            if let Err(e) = r {
                if q.dead().is_none() {
                    tracing::warn!("keep-alive failed: {e}");
                }
                return;
            }
        }
    })
}

#[cfg(test)]
mod tests;
