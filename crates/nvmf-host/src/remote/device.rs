//! [`RemoteDevice`]: the `BlockDevice` over a [`Link`].

use std::sync::Arc;

use blockdev::{
    AlignedBuf, BlockDevice, BlockError, BlockOp, Geometry, IoDone, IoFuture, IoRequest,
    check_request,
};
use futures_util::future::join_all;
use nvme_wire::reservation::{
    AcquireAction, ONCS_RESERVATIONS, RegisterAction, ReleaseAction, ResvType, cptpl,
};
use nvme_wire::status::{
    SC_CAP_EXCEEDED, SC_INVALID_FIELD, SC_INVALID_OPCODE, SC_LBA_RANGE, SC_RESERVATION_CONFLICT,
    SCT_GENERIC, Status,
};
use tokio::sync::watch;

use super::link::{Link, Session};
use super::{LinkState, NsIdentity, RemoteOptions, RemoteUrl, runtime};
use crate::error::HostError;
use crate::io::{IoQueue, MAX_NLB};
use crate::queue::zeroed_buf;
use crate::resv::ReservationStatus;

/// A namespace on another node as a block device. Cheap to share (`Arc`).
pub struct RemoteDevice {
    link: Arc<Link>,
    geo: Geometry,
    dealloc_zeroes: bool,
    queues: usize,
    /// Identify Controller ONCS lists the reservation commands.
    resv_supported: bool,
}

impl RemoteDevice {
    /// Connects to `url` (`tcp://ADDR:PORT/NQN?nsid=N`) and identifies the
    /// namespace. The connections run on `opts.runtime` or the process-wide
    /// [`runtime`]; this future can be awaited from any executor.
    pub async fn connect(url: &str, opts: RemoteOptions) -> Result<RemoteDevice, BlockError> {
        let url = RemoteUrl::parse(url)?;
        let handle = opts
            .runtime
            .clone()
            .unwrap_or_else(|| runtime().handle().clone());
        let link = handle
            .spawn(Link::start(url, opts))
            .await
            .map_err(|e| BlockError::Io(std::io::Error::other(format!("connect task: {e}"))))??;
        let s = link.current().expect("a started link has a session");
        Ok(RemoteDevice {
            geo: Geometry {
                block_size: s.ns.lba_size,
                num_blocks: s.ns.nsze,
            },
            dealloc_zeroes: s.ns.deallocate_reads_zeroes(),
            queues: s.queues.len(),
            resv_supported: s.ctrl.info().oncs & ONCS_RESERVATIONS != 0,
            link,
        })
    }

    /// [`RemoteDevice::connect`] for synchronous callers (not from inside
    /// the runtime the connections use).
    pub fn open(url: &str, opts: RemoteOptions) -> Result<RemoteDevice, BlockError> {
        blockdev::block_on(Self::connect(url, opts))
    }

    pub fn url(&self) -> &RemoteUrl {
        &self.link.url
    }

    pub fn options(&self) -> &RemoteOptions {
        &self.link.opts
    }

    pub fn link_state(&self) -> LinkState {
        self.link.state()
    }

    /// Fires on every state change; the owner re-adds a failed member once it reads Connected.
    pub fn subscribe(&self) -> watch::Receiver<LinkState> {
        self.link.subscribe()
    }

    /// How many associations were made so far (1 after connect; each reconnect adds one).
    pub fn connects(&self) -> u64 {
        self.link.current().map_or(0, |s| s.generation)
    }

    /// I/O queues (connections) the device uses: the ones asked for, or
    /// fewer if the target granted fewer.
    pub fn io_queues(&self) -> usize {
        self.queues
    }

    /// Queues of the current connection bound to reactors
    /// ([`super::bind_reactors`]), beside the shared ones, and the requests
    /// their reactors sent on them.
    pub fn reactor_queues(&self) -> (usize, u64) {
        self.link.current().map_or((0, 0), |s| s.bound())
    }

    /// Whether the target lists the reservation commands (Identify
    /// Controller ONCS bit 5). Without them [`RemoteDevice::register`] and
    /// the other reservation calls fail, and the drive cannot be a fenced
    /// volume member.
    pub fn supports_reservations(&self) -> bool {
        self.resv_supported
    }

    /// The identity the namespace was attached with.
    pub fn identity(&self) -> Option<NsIdentity> {
        self.link.current().map(|s| s.identity.clone())
    }

    /// The ANA state this controller reports for the namespace
    /// (`nvme_wire::log_page::ana::STATE_*`), read from its ANA log page on
    /// the current connection (waiting for a reconnect like I/O does).
    /// `None`: the controller keeps no ANA log, or lists no group for the
    /// namespace; a multipath host then treats the path as usable.
    pub async fn ana_state(&self) -> Result<Option<u8>, BlockError> {
        let s = self.link.session(0).await?;
        match s
            .ctrl
            .get_log_page(nvme_wire::log_page::lid::ANA, super::ana::ANA_LOG_LEN, 0)
            .await
        {
            Ok(log) => super::ana::state_of(&log, self.link.url.nsid).map_err(|why| {
                BlockError::Io(std::io::Error::other(format!(
                    "remote {}: {why}",
                    self.link.url
                )))
            }),
            // A status: the controller answered, it has no ANA log.
            Err(e) if e.status().is_some() => Ok(None),
            Err(e) => {
                if e.is_transport() {
                    self.link.report_broken(s.generation, &e);
                }
                Err(BlockError::Io(std::io::Error::other(format!(
                    "remote {}: ANA log: {e}",
                    self.link.url
                ))))
            }
        }
    }

    /// Registers `key` for this host (its host ID is the registrant). A
    /// host registered with another key replaces it (IEKEY). Asks for
    /// Persist Through Power Loss where the drive can keep it, so that a
    /// restarted enclosure still fences a deposed owner; a drive that
    /// cannot (RAM) is registered without it.
    pub async fn register(&self, key: u64) -> Result<(), BlockError> {
        let nsid = self.link.url.nsid;
        self.resv(|q| async move {
            let reg = async |ptpl: u8| match q
                .resv_register(nsid, RegisterAction::Register, 0, key, false, ptpl)
                .await
            {
                Err(e) if e.is_reservation_conflict() => {
                    q.resv_register(nsid, RegisterAction::Replace, 0, key, true, ptpl)
                        .await
                }
                r => r,
            };
            match reg(cptpl::SET).await {
                Err(e) if e.status() == Some(Status::generic(SC_INVALID_FIELD)) => {
                    reg(cptpl::NO_CHANGE).await
                }
                r => r,
            }
        })
        .await
    }

    /// Removes this host's registration (and its reservation, if it holds one).
    pub async fn unregister(&self, key: u64) -> Result<(), BlockError> {
        let nsid = self.link.url.nsid;
        self.resv(|q| async move {
            q.resv_register(
                nsid,
                RegisterAction::Unregister,
                key,
                0,
                false,
                cptpl::NO_CHANGE,
            )
            .await
        })
        .await
    }

    /// Takes a reservation of `rtype` with our registered `key`.
    pub async fn acquire(&self, key: u64, rtype: ResvType) -> Result<(), BlockError> {
        let nsid = self.link.url.nsid;
        self.resv(|q| async move {
            q.resv_acquire(nsid, AcquireAction::Acquire, rtype, key, 0, false)
                .await
        })
        .await
    }

    /// Removes the registrations of `victim` (the old owner's key), takes
    /// the reservation as `rtype`, and aborts the victim's commands in flight.
    pub async fn preempt_abort(
        &self,
        key: u64,
        victim: u64,
        rtype: ResvType,
    ) -> Result<(), BlockError> {
        let nsid = self.link.url.nsid;
        self.resv(|q| async move {
            q.resv_acquire(
                nsid,
                AcquireAction::PreemptAndAbort,
                rtype,
                key,
                victim,
                false,
            )
            .await
        })
        .await
    }

    /// Releases our reservation of `rtype`.
    pub async fn release(&self, key: u64, rtype: ResvType) -> Result<(), BlockError> {
        let nsid = self.link.url.nsid;
        self.resv(|q| async move {
            q.resv_release(nsid, ReleaseAction::Release, rtype, key, false)
                .await
        })
        .await
    }

    /// The registrants and the reservation now.
    pub async fn report(&self) -> Result<ReservationStatus, BlockError> {
        let nsid = self.link.url.nsid;
        let mut out = None;
        let out_ref = &mut out;
        self.resv(|q| async move {
            *out_ref = Some(q.resv_report(nsid).await?);
            Ok(())
        })
        .await?;
        Ok(out.expect("set on success"))
    }

    /// Runs one reservation command on a queue of the current connection
    /// (waiting for a reconnect like I/O does; not retried).
    async fn resv<F, Fut>(&self, f: F) -> Result<(), BlockError>
    where
        F: FnOnce(Arc<IoQueue>) -> Fut,
        Fut: std::future::Future<Output = Result<(), HostError>>,
    {
        if !self.resv_supported {
            return Err(no_reservations(
                &self.link.url,
                "its Identify Controller does not list them: ONCS bit 5 is clear",
            ));
        }
        let s = self.link.session(0).await?;
        let r = f(s.pick().clone()).await;
        r.map_err(|e| {
            if e.is_transport() {
                self.link.report_broken(s.generation, &e);
            }
            if e.status() == Some(Status::generic(SC_INVALID_OPCODE)) {
                return no_reservations(
                    &self.link.url,
                    &format!("it answered a reservation command with {e}"),
                );
            }
            status_error(&self.link.url, &e, 0, 0, self.geo.num_blocks)
        })
    }
}

impl Drop for RemoteDevice {
    fn drop(&mut self) {
        self.link.close();
    }
}

impl BlockDevice for RemoteDevice {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn submit(&self, req: IoRequest) -> IoFuture {
        if let Err(e) = check_request(self.geo, &req) {
            return IoFuture::ready(req.buf, Err(e));
        }
        if let Some(e) = self.link.state_error(&self.link.state()) {
            return IoFuture::ready(req.buf, Err(e));
        }
        let link = self.link.clone();
        let num_blocks = self.geo.num_blocks;
        IoFuture::Pending(Box::pin(run_io(link, req, num_blocks)))
    }

    fn deallocate_reads_zeroes(&self) -> bool {
        self.dealloc_zeroes
    }

    fn describe(&self) -> String {
        format!("remote {} ({} queues)", self.link.url, self.queues)
    }

    fn shutdown(&self) -> Result<(), BlockError> {
        self.link.close();
        Ok(())
    }

    fn keeps_records(&self) -> bool {
        false
    }
}

/// One request: on the current connection; after a transport error once
/// more on the next connection; then it fails.
async fn run_io(link: Arc<Link>, req: IoRequest, num_blocks: u64) -> IoDone {
    let mut buf = req.buf;
    let mut min_gen = 0;
    let mut retried = false;
    loop {
        let s = match link.current().filter(|s| s.generation >= min_gen) {
            Some(s) => s,
            None => match link.session(min_gen).await {
                Ok(s) => s,
                Err(e) => {
                    return IoDone {
                        buf,
                        result: Err(e),
                    };
                }
            },
        };
        let need = match req.op {
            BlockOp::Read | BlockOp::Write { .. } => req.blocks as usize * s.ns.lba_size as usize,
            _ => 0,
        };
        let (b, r) = exec(&s, req.op, req.lba, req.blocks, need, buf).await;
        buf = b;
        let e = match r {
            Ok(()) => {
                return IoDone {
                    buf,
                    result: Ok(()),
                };
            }
            Err(e) => e,
        };
        if !e.is_transport() {
            let result = Err(status_error(
                &link.url,
                &e,
                req.lba,
                u64::from(req.blocks),
                num_blocks,
            ));
            return IoDone { buf, result };
        }
        link.report_broken(s.generation, &e);
        if retried || buf.len() < need {
            let result = Err(BlockError::Io(std::io::Error::other(format!(
                "remote {}: {:?} of {}+{} failed again after a reconnect: {e}",
                link.url, req.op, req.lba, req.blocks
            ))));
            return IoDone { buf, result };
        }
        retried = true;
        min_gen = s.generation + 1;
    }
}

/// Carries out one request on one queue of session `s`; splits it into
/// commands of at most `s.max_blocks` blocks.
async fn exec(
    s: &Session,
    op: BlockOp,
    lba: u64,
    blocks: u32,
    need: usize,
    mut buf: AlignedBuf,
) -> (AlignedBuf, Result<(), HostError>) {
    let q = s.pick();
    let nsid = s.ns.nsid;
    match op {
        BlockOp::Flush => (buf, q.flush(nsid).await),
        BlockOp::Deallocate => (buf, q.deallocate(nsid, &[(lba, blocks)]).await),
        BlockOp::WriteZeroes => {
            let mut at = 0;
            while at < blocks {
                let n = (blocks - at).min(MAX_NLB);
                if let Err(e) = q.write_zeroes(nsid, lba + u64::from(at), n).await {
                    return (buf, Err(e));
                }
                at += n;
            }
            (buf, Ok(()))
        }
        BlockOp::Read | BlockOp::Write { .. } if blocks <= s.max_blocks => {
            // The common case: the request's own buffer goes to the socket.
            let len = buf.len();
            buf.set_len(need);
            let (mut b, r) = match op {
                BlockOp::Read => q.read_buf(nsid, lba, blocks, buf).await,
                BlockOp::Write { fua } => q.write_buf_fua(nsid, lba, blocks, fua, buf).await,
                _ => unreachable!("read or write"),
            };
            if b.capacity() >= len {
                b.set_len(len);
            }
            (b, r)
        }
        BlockOp::Read | BlockOp::Write { .. } => {
            // Larger than one command moves: one command per piece, all in
            // flight together, each on a view of the request's own buffer
            // (no bounce buffer, no copy).
            let bs = s.ns.lba_size as usize;
            let max = s.max_blocks;
            let pieces: Vec<(u64, u32, std::ops::Range<usize>)> = (0..blocks)
                .step_by(max as usize)
                .map(|at| {
                    let n = (blocks - at).min(max);
                    let r = at as usize * bs..(at + n) as usize * bs;
                    (lba + u64::from(at), n, r)
                })
                .collect();
            match op {
                BlockOp::Write { fua } => {
                    let shared = buf.share();
                    let done = join_all(pieces.iter().map(|(slba, n, r)| {
                        q.write_buf_fua(nsid, *slba, *n, fua, shared.view(r.clone()))
                    }))
                    .await;
                    let r = first_error(done);
                    match shared.try_unwrap() {
                        Ok(b) => (b, r),
                        // No queue keeps a view past its command; should one,
                        // the bytes are still the caller's: copy them back.
                        Err(sh) => {
                            let mut b = zeroed_buf(sh.len());
                            b.copy_from_slice(&sh);
                            (b, r)
                        }
                    }
                }
                _ => {
                    let ranges: Vec<_> = pieces.iter().map(|p| p.2.clone()).collect();
                    let (held, views) = buf.split_mut(&ranges);
                    let done = join_all(
                        pieces
                            .iter()
                            .zip(views)
                            .map(|((slba, n, _), v)| q.read_buf(nsid, *slba, *n, v)),
                    )
                    .await;
                    let r = first_error(done);
                    match held.try_unwrap() {
                        Ok(b) => (b, r),
                        // A view still held elsewhere: its bytes cannot be trusted.
                        Err(_) => (
                            zeroed_buf(need),
                            Err(HostError::Invalid(
                                "a read view outlived its command".into(),
                            )),
                        ),
                    }
                }
            }
        }
    }
}

/// The first error of commands that all ran; their views are dropped.
fn first_error(done: Vec<(AlignedBuf, Result<(), HostError>)>) -> Result<(), HostError> {
    done.into_iter().try_for_each(|(_, r)| r)
}

/// The error of a reservation call on a target without reservations.
fn no_reservations(url: &RemoteUrl, why: &str) -> BlockError {
    BlockError::Config(format!(
        "remote {url}: the target does not support reservations ({why}); a drive it exports \
         cannot be a fenced volume member (an owner could not fence a deposed one): export it \
         from a target with NVMe reservations, e.g. a flashpool node"
    ))
}

/// A status the controller answered with, as the `BlockError` a volume acts on.
fn status_error(
    url: &RemoteUrl,
    e: &HostError,
    lba: u64,
    blocks: u64,
    num_blocks: u64,
) -> BlockError {
    match e.status() {
        Some(s) if s.sct == SCT_GENERIC && s.sc == SC_RESERVATION_CONFLICT => {
            BlockError::ReservationConflict(format!("remote {url}: {e}"))
        }
        Some(s) if s.sct == SCT_GENERIC && s.sc == SC_LBA_RANGE => BlockError::OutOfRange {
            lba,
            blocks,
            num_blocks,
        },
        Some(s) if s.sct == SCT_GENERIC && s.sc == SC_CAP_EXCEEDED => BlockError::NoSpace,
        _ => BlockError::Io(std::io::Error::other(format!("remote {url}: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_without_reservations_is_named_with_what_to_do() {
        let url =
            RemoteUrl::parse("tcp://10.0.2.2:4420/nqn.2014-08.org.example:n1?nsid=1").unwrap();
        let e = no_reservations(&url, "ONCS bit 5 is clear").to_string();
        for want in [
            "remote tcp://10.0.2.2:4420/nqn.2014-08.org.example:n1?nsid=1",
            "the target does not support reservations (ONCS bit 5 is clear)",
            "cannot be a fenced volume member",
        ] {
            assert!(e.contains(want), "{e}");
        }
    }
}
