//! `flashpool attach TARGET DIR`: a namespace as a local file, `DIR/disk`,
//! through FUSE and the user-space NVMe/TCP host, for containers and for
//! kernels without `nvme-tcp`. `losetup --direct-io=on` makes it a block
//! device again (docs/attach.md).
//!
//! - `target.rs`: the TARGET words (tcp://, mem:, file:) and opening them;
//! - `disk.rs`: file offsets onto blocks (read-modify-write at the edges),
//!   with `ranges.rs`, the block-range locks that keep concurrent edges apart;
//! - `multipath.rs`: ANA multipath over every portal of a cluster subsystem;
//! - `fs.rs`: the FUSE filesystem, each request a task on the attach runtime;
//! - this file: the command line, the checks before mounting, the mount,
//!   and the unmount on SIGTERM/SIGINT or `fusermount3 -u`.

mod disk;
mod fs;
mod multipath;
mod ranges;
mod target;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use fuser::{Config, MountOption, SessionACL};
use signal_hook::consts::{SIGINT, SIGTERM};

use crate::output::outln;
use disk::Disk;
use target::{OpenOptions, Target};

#[derive(clap::Args, Debug)]
pub struct AttachArgs {
    /// What to attach: tcp://HOST:PORT/NQN?nsid=N (a namespace over NVMe/TCP),
    /// mem:SIZE (RAM in this process) or file:PATH (a local file or block device).
    pub target: String,
    /// An empty directory to mount; the namespace appears as DIR/disk.
    pub dir: PathBuf,
    /// I/O queues (TCP connections) to a tcp:// namespace.
    #[arg(long, default_value_t = 4)]
    pub queues: u16,
    /// Commands in flight per I/O queue.
    #[arg(long, default_value_t = 128)]
    pub queue_depth: u16,
    /// Requests the kernel may send at once (FUSE max_background).
    #[arg(long, default_value_t = 128)]
    pub fuse_queue: u16,
    /// Threads reading requests from the kernel.
    #[arg(long, default_value_t = 2)]
    pub fuse_threads: usize,
    /// How long I/O waits for a lost connection to come back before it fails (EIO).
    #[arg(long, default_value = "30s", value_parser = crate::units::parse_duration)]
    pub fail_after: Duration,
    /// Block size of a mem: disk or file: device (512 or 4096).
    #[arg(long, default_value_t = 512)]
    pub block_size: u32,
    /// Every open of DIR/disk goes around the page cache, as O_DIRECT would.
    #[arg(long)]
    pub direct_io: bool,
    /// Let users other than the one who attached open DIR/disk.
    #[arg(long)]
    pub allow_other: bool,
    /// Discovery service of a tcp:// target (ADDR:PORT): every portal it lists for the
    /// subsystem becomes a path, and I/O follows ANA (the Optimized path; after a path
    /// error or an ANA change the new one). Default: the target's host, port 8009.
    #[arg(long, value_name = "ADDR:PORT")]
    pub discovery: Option<String>,
    /// Only the URL's portal: no discovery, no multipath.
    #[arg(long, conflicts_with = "discovery")]
    pub single_path: bool,
    /// Host NQN to connect with (default: this machine's).
    #[arg(long)]
    pub hostnqn: Option<String>,
}

pub fn run(a: AttachArgs) -> Result<()> {
    init_logging();
    let target = Target::parse(&a.target)?;
    check_dir(&a.dir)?;
    check_fuse()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("attach")
        .enable_all()
        .build()
        .context("cannot start the attach runtime")?;
    let o = OpenOptions {
        queues: a.queues.max(1),
        queue_depth: a.queue_depth.max(2),
        fail_after: a.fail_after,
        block_size: a.block_size,
        hostnqn: a.hostnqn.clone(),
        discovery: match &target {
            Target::Tcp(_) if a.single_path => None,
            Target::Tcp(u) => Some(a.discovery.clone().unwrap_or_else(|| {
                if u.host.contains(':') {
                    format!("[{}]:8009", u.host)
                } else {
                    format!("{}:8009", u.host)
                }
            })),
            _ => None,
        },
    };
    let dev = rt.block_on(target::open(&target, &o))?;
    let disk = Disk::new(dev);
    let what = disk.describe();
    let size = disk.size();
    let fs = fs::DiskFs::new(disk, rt.handle().clone(), a.fuse_queue, a.direct_io);

    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(format!("flashpool:{}", a.target)),
        MountOption::Subtype("flashpool".into()),
        MountOption::NoSuid,
        MountOption::NoDev,
        MountOption::NoExec,
    ];
    if a.allow_other {
        config.acl = SessionACL::All;
    }
    config.n_threads = Some(a.fuse_threads.max(1));
    config.clone_fd = a.fuse_threads > 1;
    let session = fuser::Session::new(fs, &a.dir, &config).map_err(|e| mount_error(&a.dir, e))?;
    let mount_point = a.dir.canonicalize().unwrap_or_else(|_| a.dir.clone());
    let disk_path = a.dir.join(fs::DISK_NAME);
    outln!(
        "attached {} ({} bytes) at {}",
        what,
        size,
        disk_path.display()
    );

    // The session runs on its own thread until the mount goes away (our
    // unmount below, or `fusermount3 -u DIR` / `umount DIR` by the user).
    let (tx, rx) = mpsc::channel::<Event>();
    let done = tx.clone();
    let serving = std::thread::Builder::new()
        .name("fuse-session".into())
        .spawn(move || {
            let r = session.run();
            let _ = done.send(Event::Ended(r));
        })
        .context("cannot start the FUSE session thread")?;
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])
        .context("cannot install the SIGTERM/SIGINT handlers")?;
    let sig_handle = signals.handle();
    std::thread::Builder::new()
        .name("attach-signals".into())
        .spawn(move || {
            for s in signals.forever() {
                if tx.send(Event::Signal(s)).is_err() {
                    return;
                }
            }
        })
        .context("cannot start the signal thread")?;

    // Once our unmount succeeded the session normally ends at once; a copy of
    // the mount in another mount namespace (a process that unshared its
    // mounts after we mounted, e.g. `ip netns exec`) keeps the connection
    // open, and nobody can reach that copy's file by path from here: stop then.
    let mut unmounted = false;
    let ended = loop {
        let ev = if unmounted {
            match rx.recv_timeout(Duration::from_secs(2)) {
                Ok(ev) => ev,
                Err(_) => {
                    tracing::warn!(
                        "{} is unmounted here but still mounted in another mount namespace; \
                         ending the FUSE connection",
                        a.dir.display()
                    );
                    break Ok(());
                }
            }
        } else {
            rx.recv().expect("the session thread reports its end")
        };
        match ev {
            Event::Ended(r) => break r,
            Event::Signal(s) => {
                let name = if s == SIGINT { "SIGINT" } else { "SIGTERM" };
                match unmount(&mount_point) {
                    Ok(()) => {
                        tracing::info!("{name}: unmounted {}", a.dir.display());
                        unmounted = true;
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        // Exiting now would pull the disk from under its user
                        // (a loop device, a mounted filesystem): keep serving.
                        tracing::warn!(
                            "{name}: {} is busy (a loop device, a mount or an open file uses \
                             DIR/disk): still serving; detach it (umount, losetup -d) and \
                             signal again",
                            a.dir.display()
                        );
                    }
                    Err(e) => {
                        tracing::warn!("{name}: cannot unmount {}: {e}", a.dir.display())
                    }
                }
            }
        }
    };
    sig_handle.close();
    if !unmounted || serving.is_finished() {
        let _ = serving.join();
    }
    let r = ended.with_context(|| format!("the FUSE session at {} failed", a.dir.display()));
    rt.shutdown_timeout(Duration::from_secs(2));
    r?;
    outln!("detached {}", a.dir.display());
    Ok(())
}

/// Log lines on stderr: `info` (the attach, path changes, failed I/O) unless RUST_LOG says.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

enum Event {
    Signal(i32),
    Ended(std::io::Result<()>),
}

/// DIR must exist, be a directory, and not already be a mount of ours.
fn check_dir(dir: &Path) -> Result<()> {
    let m = std::fs::metadata(dir).map_err(|e| {
        anyhow::anyhow!(
            "{}: {e}; create an empty directory to mount on (mkdir -p {})",
            dir.display(),
            dir.display()
        )
    })?;
    if !m.is_dir() {
        bail!(
            "{} is not a directory; give an empty directory to mount on (the disk appears as DIR/disk)",
            dir.display()
        );
    }
    Ok(())
}

/// FUSE needs /dev/fuse, and fusermount3 unless we are root.
fn check_fuse() -> Result<()> {
    if !Path::new("/dev/fuse").exists() {
        bail!(
            "FUSE is not available: /dev/fuse is missing (load the module: modprobe fuse; in a \
             container, pass the device: --device /dev/fuse)"
        );
    }
    // SAFETY: geteuid cannot fail and touches no memory.
    let root = unsafe { libc::geteuid() } == 0;
    if !root && !on_path("fusermount3") && !on_path("fusermount") {
        bail!(
            "FUSE is not usable by this user: fusermount3 is not installed (Debian/Ubuntu: \
             apt-get install fuse3), and only root can mount without it"
        );
    }
    Ok(())
}

fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
}

/// Unmounts DIR: umount(2) as root, else `fusermount3 -u`. A mount still
/// in use fails with EBUSY and stays (fuser's own unmounter gives up its
/// handle on the first try, so a second signal could not retry).
fn unmount(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: a valid NUL-terminated path; umount2 touches nothing else.
    if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EPERM) {
        return Err(e);
    }
    let bin = if on_path("fusermount3") {
        "fusermount3"
    } else {
        "fusermount"
    };
    let out = std::process::Command::new(bin)
        .arg("-u")
        .arg("--")
        .arg(dir)
        .output()?;
    if out.status.success() {
        return Ok(());
    }
    let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if why.contains("busy") {
        return Err(std::io::Error::from_raw_os_error(libc::EBUSY));
    }
    Err(std::io::Error::other(format!("{bin} -u: {why}")))
}

/// A failed mount, with what to do about it.
fn mount_error(dir: &Path, e: std::io::Error) -> anyhow::Error {
    let hint = match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => {
            " (not allowed to mount here: run as root, or install fuse3's fusermount3 and own DIR)"
        }
        Some(libc::ENODEV) => " (the kernel has no FUSE: modprobe fuse)",
        Some(libc::ENOENT) => " (fusermount3 is missing: apt-get install fuse3)",
        Some(libc::EBUSY) => " (something is already mounted there)",
        _ => "",
    };
    anyhow::anyhow!("cannot mount FUSE at {}: {e}{hint}", dir.display())
}
