//! Opening a target: an NVMe/TCP controller (one I/O queue per job, or one
//! shared `RemoteDevice` with `--engine remote`), a file or block device, or
//! RAM; with the line that describes what was opened.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use blockdev::{BlockDevice, FileDevice, FileOptions, MemDevice};
use nvmf_host::remote::{RemoteDevice, RemoteOptions};
use nvmf_host::{Controller, HostOptions};

use crate::spec::{self, Engine, Target, Workload};

/// The target, opened.
pub(crate) enum Opened {
    Tcp {
        ctrl: Arc<Controller>,
        nsid: u32,
    },
    Dev(Arc<dyn BlockDevice>),
    /// `--engine remote`: the jobs share it as a `BlockDevice`.
    Remote(Arc<RemoteDevice>),
}

/// An opened target: its LBA size and count, and what it turned out to be.
pub(crate) struct Device {
    pub(crate) opened: Opened,
    pub(crate) lba_size: u32,
    pub(crate) num_blocks: u64,
    pub(crate) detail: String,
}

/// Opens `target` as `w` needs it; refuses one that cannot take `w` (too few
/// queues, too shallow, too small a transfer).
pub(crate) async fn open(target: &Target, w: &Workload) -> Result<Device> {
    // Local devices: 4 KiB blocks when the I/O size allows (O_DIRECT on 4Kn drives), else 512.
    let local_bs = if w.bs.is_multiple_of(4096) { 4096 } else { 512 };
    match target {
        Target::Tcp { addr, nqn, nsid } if w.engine == Engine::Remote => {
            open_remote(target, w, *addr, nqn, *nsid).await
        }
        Target::Tcp { addr, nqn, nsid } => {
            let mut o = HostOptions {
                hdr_digest: w.hdr_digest,
                data_digest: w.data_digest,
                nr_io_queues: w.jobs.min(u32::from(u16::MAX)) as u16,
                queue_depth: w.qd.clamp(2, u32::from(u16::MAX)) as u16,
                lazy_io_queues: true,
                poll_us: w.poll_us,
                in_capsule_max: w.in_capsule,
                pdu_per_write: w.pdu_per_write,
                ..HostOptions::default()
            };
            if let Some(h) = &w.hostnqn {
                o.hostnqn = h.clone();
            }
            o.dhchap = w.dhchap.clone();
            o.tls = w.tls.clone();
            let ctrl = Controller::connect(*addr, nqn, o).await?;
            if u32::from(ctrl.granted_io_queues()) < w.jobs {
                bail!(
                    "{target}: the target grants {} I/O queues, --jobs {} needs one each; lower --jobs \
                     (or raise the target's transport.max_io_queues)",
                    ctrl.granted_io_queues(),
                    w.jobs
                );
            }
            if u32::from(ctrl.io_queue_depth()) < w.qd {
                bail!(
                    "{target}: the target takes at most {} commands per queue, --qd {} is more; lower --qd \
                     (or raise the target's transport.max_queue_depth)",
                    ctrl.io_queue_depth(),
                    w.qd
                );
            }
            let nsid =
                match nsid {
                    Some(n) => *n,
                    None => *ctrl.active_namespaces().await?.first().with_context(|| {
                        format!("{target}: the subsystem has no active namespace")
                    })?,
                };
            let ns = ctrl.identify_namespace(nsid).await?;
            let info = ctrl.info();
            let (hd, dd) = ctrl.digests();
            let onoff = |b: bool| if b { "on" } else { "off" };
            let detail = format!(
                "NVMe/TCP {addr} {nqn} nsid {nsid}: {}, {} B LBAs; controller {} \"{}\" serial {}; \
                 digests header {} data {}; in-capsule {} B, MAXH2CDATA {} B",
                spec::human_bytes(ns.size_bytes()),
                ns.lba_size,
                ctrl.cntlid(),
                info.model,
                info.serial,
                onoff(hd),
                onoff(dd),
                info.in_capsule_data(),
                ctrl.max_h2c_data()
            );
            if let Some(mt) = info.max_transfer()
                && u64::from(w.bs) > mt
            {
                bail!(
                    "{target}: --bs {} is over the controller's largest transfer ({mt} bytes, MDTS)",
                    w.bs
                );
            }
            Ok(Device {
                opened: Opened::Tcp {
                    ctrl: Arc::new(ctrl),
                    nsid,
                },
                lba_size: ns.lba_size,
                num_blocks: ns.nsze,
                detail,
            })
        }
        Target::File(path) => {
            let dev = FileDevice::open(FileOptions {
                path: path.clone(),
                size: None,
                block_size: local_bs,
                create: false,
            })
            .with_context(|| format!("{target}"))?;
            Ok(local(Arc::new(dev)))
        }
        Target::Mem(size) => {
            let size = size - size % u64::from(local_bs);
            let dev = MemDevice::new(size, local_bs).with_context(|| format!("{target}"))?;
            Ok(local(Arc::new(dev)))
        }
    }
}

/// `--engine remote`: one `RemoteDevice` for all jobs, with the options a
/// volume's remote member gets unless the command line says otherwise.
async fn open_remote(
    target: &Target,
    w: &Workload,
    addr: std::net::SocketAddr,
    nqn: &str,
    nsid: Option<u32>,
) -> Result<Device> {
    let queues = w.queues.unwrap_or(w.jobs);
    let mut o = RemoteOptions {
        io_queues: queues.min(u32::from(u16::MAX)) as u16,
        ..RemoteOptions::default()
    };
    // Every job's I/Os at once fit in the queues (more would wait for a slot);
    // the connect clamps this to what the target takes (CAP.MQES).
    let depth = (w.qd * w.jobs)
        .div_ceil(queues)
        .clamp(2, u32::from(u16::MAX));
    o.host.queue_depth = (depth as u16).max(o.host.queue_depth);
    o.host.hdr_digest = w.hdr_digest;
    o.host.data_digest = w.data_digest;
    if let Some(h) = &w.hostnqn {
        o.host.hostnqn = h.clone();
    }
    o.host.dhchap = w.dhchap.clone();
    o.host.tls = w.tls.clone();
    if let Some(f) = w.fail_after {
        o.fail_after = f;
    }
    let fail_after = o.fail_after;
    let url = format!("tcp://{addr}/{nqn}?nsid={}", nsid.unwrap_or(1));
    let dev = RemoteDevice::connect(&url, o)
        .await
        .with_context(|| format!("{target}: --engine remote"))?;
    if (dev.io_queues() as u32) < queues {
        bail!(
            "{target}: the target grants {} I/O queues, --engine remote asked for {queues}; lower \
             --queues (or --jobs), or raise the target's transport.max_io_queues",
            dev.io_queues()
        );
    }
    let g = dev.geometry();
    let detail = format!(
        "{} (engine remote: {} queues shared by {} jobs, {} B LBAs, {}; digests header {} data {}; \
         reservations {}; fail after {:?})",
        dev.describe(),
        dev.io_queues(),
        w.jobs,
        g.block_size,
        spec::human_bytes(g.num_blocks * u64::from(g.block_size)),
        onoff(w.hdr_digest),
        onoff(w.data_digest),
        if dev.supports_reservations() {
            "supported"
        } else {
            "not supported"
        },
        fail_after,
    );
    Ok(Device {
        lba_size: g.block_size,
        num_blocks: g.num_blocks,
        detail,
        opened: Opened::Remote(Arc::new(dev)),
    })
}

fn onoff(b: bool) -> &'static str {
    if b { "on" } else { "off" }
}

fn local(dev: Arc<dyn BlockDevice>) -> Device {
    let g = dev.geometry();
    Device {
        detail: dev.describe(),
        lba_size: g.block_size,
        num_blocks: g.num_blocks,
        opened: Opened::Dev(dev),
    }
}
