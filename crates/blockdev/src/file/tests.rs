//! Tests of the io_uring file backend: I/O on files and their errors, O_DIRECT
//! fallback, WriteZeroes/Deallocate fallbacks, device-kept records, shutdown.

use std::sync::atomic::AtomicU32;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::{AlignedBuf, BlockDevice, BlockOp, IoRequest, RECORD_MAX, RecordKind};

use super::records::{BLOCK_DEVICE_NO_RECORDS, record_xattr, xattr_reason};
use super::ring::SQ_ENTRIES;
use super::*;
use crate::testutil::*;

/// A fresh directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(base: &Path, tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = base.join(format!(
            "flashpool-blockdev-{}-{tag}-{n}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("create test dir");
        TempDir(dir)
    }
    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The system temp dir, the workspace's target dir (a real filesystem) and
/// /dev/shm (tmpfs) where there is one.
fn bases() -> Vec<PathBuf> {
    let mut v = vec![
        std::env::temp_dir(),
        Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../target/blockdev-tests"
        ))
        .canonicalize()
        .unwrap_or_else(|_| {
            let p = Path::new(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../target/blockdev-tests"
            ));
            std::fs::create_dir_all(p).expect("create target/blockdev-tests");
            p.canonicalize().expect("canonical target dir")
        }),
    ];
    if Path::new("/dev/shm").is_dir() {
        v.push(PathBuf::from("/dev/shm"));
    }
    v
}

fn new_file(path: &Path, size: u64, block_size: u32) -> FileDevice {
    FileDevice::open(FileOptions {
        path: path.to_owned(),
        size: Some(size),
        block_size,
        create: true,
    })
    .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

fn open_err(path: &Path, size: Option<u64>, block_size: u32, create: bool) -> String {
    match FileDevice::open(FileOptions {
        path: path.to_owned(),
        size,
        block_size,
        create,
    }) {
        Ok(dev) => panic!("opened {}: {}", path.display(), dev.describe()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn roundtrip_and_persist_across_reopen() {
    for base in bases() {
        let dir = TempDir::new(&base, "persist");
        for bs in [4096u32, 512] {
            let path = dir.file(&format!("disk-{bs}.img"));
            let dev = new_file(&path, 1 << 20, bs);
            let desc = dev.describe();
            eprintln!("{desc}");
            assert!(
                desc.contains(&*path.to_string_lossy()) && desc.contains("io_uring"),
                "{desc}"
            );
            check_random_roundtrip(&dev, u64::from(bs), 200);
            let mut data = vec![0u8; 8 * bs as usize];
            Rng::new(42).fill(&mut data);
            write(&dev, 17, &data);
            dev.shutdown().expect("shutdown");
            drop(dev);

            let dev = FileDevice::open(FileOptions {
                path: path.clone(),
                size: None,
                block_size: bs,
                create: false,
            })
            .expect("reopen");
            assert_eq!(dev.geometry().size_bytes(), 1 << 20);
            assert_eq!(read(&dev, 17, 8), data, "{desc}: data after reopen");
        }
    }
}

#[test]
fn buffered_fallback_works_and_says_so() {
    let dir = TempDir::new(&std::env::temp_dir(), "buffered");
    let path = dir.file("b.img");
    let opts = FileOptions {
        path: path.clone(),
        size: Some(1 << 20),
        block_size: 512,
        create: true,
    };
    let dev = FileDevice::open_with(opts.clone(), false).expect("buffered open");
    assert!(dev.describe().contains("buffered"), "{}", dev.describe());
    check_random_roundtrip(&dev, 11, 100);
    check_zeroing(&dev, 12);
    let mut data = vec![0u8; 3 * 512];
    Rng::new(13).fill(&mut data);
    write(&dev, 1, &data);
    dev.shutdown().unwrap();
    drop(dev);
    let dev = FileDevice::open_with(opts, false).expect("buffered reopen");
    assert_eq!(read(&dev, 1, 3), data);
}

#[test]
fn bad_requests_error_not_panic() {
    let dir = TempDir::new(&std::env::temp_dir(), "bad");
    let dev = new_file(&dir.file("d.img"), 64 * 4096, 4096);
    check_bad_requests(&dev);
    dev.shutdown().unwrap();
    // After shutdown requests are refused, and the buffer still comes back.
    let done = io(&dev, BlockOp::Read, 0, 1, buf_of(4096));
    assert!(done.result.is_err());
    assert_eq!(done.buf.len(), 4096);
    dev.shutdown().expect("second shutdown is harmless");
}

#[test]
fn zeroing_reads_back_zeroes() {
    for base in bases() {
        let dir = TempDir::new(&base, "zero");
        let dev = new_file(&dir.file("z.img"), 3 << 20, 4096);
        assert!(
            dev.deallocate_reads_zeroes(),
            "punch hole on {}",
            base.display()
        );
        check_zeroing(&dev, 5);
        // Again with WriteZeroes forced onto plain writes of the zero buffer,
        // over ranges bigger than one ZERO_CHUNK.
        dev.force_zero_writes();
        check_zeroing(&dev, 6);
        check_random_roundtrip(&dev, 7, 20);
    }
}

#[test]
fn fua_and_flush() {
    let dir = TempDir::new(&std::env::temp_dir(), "fua");
    let dev = new_file(&dir.file("f.img"), 1 << 20, 4096);
    let mut buf = buf_of(4096);
    buf.fill(9);
    io(&dev, BlockOp::Write { fua: true }, 3, 1, buf)
        .result
        .expect("fua write");
    io(&dev, BlockOp::Flush, 0, 0, AlignedBuf::new(0))
        .result
        .expect("flush");
    assert!(read(&dev, 3, 1).iter().all(|&b| b == 9));
}

#[test]
fn concurrent_threads() {
    let dir = TempDir::new(&std::env::temp_dir(), "conc");
    let dev: Arc<dyn BlockDevice> = Arc::new(new_file(&dir.file("c.img"), 2 << 20, 4096));
    check_concurrent(Arc::clone(&dev), 6, 40);
    dev.shutdown().unwrap();
}

#[test]
fn dropped_futures_and_drop_with_io_in_flight() {
    let dir = TempDir::new(&std::env::temp_dir(), "drop");
    let path = dir.file("d.img");
    let dev = new_file(&path, 1 << 20, 512);
    // More requests than the submission queue holds, all in flight at once.
    let n = 3 * SQ_ENTRIES as u64;
    let pattern = |lba: u64| (lba % 251) as u8 + 1;
    for lba in 0..n {
        let mut buf = buf_of(512);
        buf.fill(pattern(lba));
        // The future is dropped at once: the record keeps the buffer alive.
        drop(dev.submit(IoRequest {
            op: BlockOp::Write { fua: false },
            lba,
            blocks: 1,
            buf,
        }));
    }
    // Dropping without shutdown waits for those writes and stops the reaper.
    drop(dev);
    let dev = FileDevice::open(FileOptions {
        path,
        size: None,
        block_size: 512,
        create: false,
    })
    .unwrap();
    // Reads with many in flight too, awaited after all are submitted.
    let futs: Vec<_> = (0..n)
        .map(|lba| {
            dev.submit(IoRequest {
                op: BlockOp::Read,
                lba,
                blocks: 1,
                buf: buf_of(512),
            })
        })
        .collect();
    for (lba, f) in (0..n).zip(futs) {
        let done = block_on(f);
        done.result.expect("read");
        assert!(done.buf.iter().all(|&b| b == pattern(lba)), "block {lba}");
    }
}

#[test]
#[ignore = "needs FLASHPOOL_TEST_BLOCKDEV=/dev/... (destroyed)"]
fn block_device() {
    let Some(path) = std::env::var_os("FLASHPOOL_TEST_BLOCKDEV") else {
        return;
    };
    let opts = FileOptions {
        path: path.into(),
        size: None,
        block_size: 4096,
        create: false,
    };
    let dev = FileDevice::open(opts.clone()).expect("open block device");
    eprintln!("{}", dev.describe());
    assert!(dev.describe().starts_with("block device"));
    assert!(!dev.deallocate_reads_zeroes());
    assert!(
        !dev.keeps_records(),
        "no xattrs on device nodes, no data area taken"
    );
    let e = dev
        .store_record(RecordKind::Reservations, b"x")
        .unwrap_err()
        .to_string();
    assert!(e.contains("block device keeps no records"), "{e}");
    let small = FileDevice::open(FileOptions {
        size: Some(4 << 20),
        ..opts.clone()
    })
    .expect("open a prefix");
    check_random_roundtrip(&small, 21, 200);
    check_zeroing(&small, 22);
    check_bad_requests(&small);
    small.shutdown().unwrap();
    let e = FileDevice::open(FileOptions {
        size: Some(dev.geometry().size_bytes() + 4096),
        ..opts
    })
    .err()
    .expect("too big")
    .to_string();
    assert!(e.contains("less than size"), "{e}");
}

#[test]
fn records_live_in_an_xattr_and_survive_reopen() {
    // The target dir (ext4/xfs here) and /dev/shm (tmpfs).
    for base in bases() {
        let dir = TempDir::new(&base, "records");
        let path = dir.file("r.img");
        let dev = new_file(&path, 1 << 20, 4096);
        if !dev.keeps_records() {
            let e = dev
                .store_record(RecordKind::Reservations, b"x")
                .unwrap_err()
                .to_string();
            eprintln!("{}: no records: {e}", base.display());
            assert!(e.contains(&*path.to_string_lossy()), "{e}");
            continue;
        }
        assert_eq!(dev.load_record(RecordKind::Reservations).unwrap(), None);
        let data = b"first".to_vec();
        write(&dev, 3, &[7u8; 4096]);
        dev.store_record(RecordKind::Reservations, &data).unwrap();
        assert_eq!(
            dev.load_record(RecordKind::Reservations).unwrap(),
            Some(data)
        );
        let mut big = vec![0u8; RECORD_MAX];
        Rng::new(9).fill(&mut big);
        dev.store_record(RecordKind::Reservations, &big).unwrap();
        assert_eq!(
            dev.load_record(RecordKind::Reservations).unwrap().as_ref(),
            Some(&big),
            "replaced"
        );
        let e = dev
            .store_record(RecordKind::Reservations, &vec![1u8; RECORD_MAX + 1])
            .unwrap_err()
            .to_string();
        assert!(e.contains("2049 bytes") && e.contains("2048"), "{e}");
        assert_eq!(
            dev.load_record(RecordKind::Reservations).unwrap().as_ref(),
            Some(&big),
            "a refused record leaves the old one"
        );
        dev.store_record(RecordKind::Reservations, b"").unwrap();
        assert_eq!(
            dev.load_record(RecordKind::Reservations).unwrap(),
            Some(vec![])
        );
        dev.store_record(RecordKind::Reservations, b"kept").unwrap();
        dev.shutdown().unwrap();
        assert!(dev.load_record(RecordKind::Reservations).is_err());
        drop(dev);

        // A new device on the same path sees it; the size is unchanged.
        let dev = FileDevice::open(FileOptions {
            path: path.clone(),
            size: None,
            block_size: 4096,
            create: false,
        })
        .unwrap();
        assert!(dev.keeps_records());
        assert_eq!(dev.geometry().size_bytes(), 1 << 20);
        assert_eq!(read(&dev, 3, 1), vec![7u8; 4096]);
        assert_eq!(
            dev.load_record(RecordKind::Reservations).unwrap(),
            Some(b"kept".to_vec())
        );
        // It is in the file's own metadata, under the documented name.
        let name = record_xattr(RecordKind::Reservations);
        let f = File::open(&path).unwrap();
        let mut buf = [0u8; 16];
        // SAFETY: NUL-terminated name, buffer of 16 bytes we own.
        let n = unsafe {
            libc::fgetxattr(
                f.as_raw_fd(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        assert_eq!(n, 4);
        assert_eq!(&buf[..4], b"kept");
    }
}

#[test]
fn records_refused_with_the_reason() {
    let dir = TempDir::new(&std::env::temp_dir(), "norec");
    let path = dir.file("n.img");
    let mut dev = new_file(&path, 1 << 20, 4096);
    // As a filesystem without user xattrs (ENOTSUP) reports it.
    dev.records = Err(xattr_reason(libc::ENOTSUP));
    assert!(!dev.keeps_records());
    assert_eq!(dev.load_record(RecordKind::Reservations).unwrap(), None);
    let e = dev
        .store_record(RecordKind::Reservations, b"x")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&*path.to_string_lossy()) && e.contains("extended attributes"),
        "{e}"
    );
    // A block device says why it keeps none.
    dev.records = Err(BLOCK_DEVICE_NO_RECORDS.to_string());
    let e = dev
        .store_record(RecordKind::Reservations, b"x")
        .unwrap_err()
        .to_string();
    assert!(e.contains("volume"), "{e}");
}

#[test]
fn open_errors_name_path_value_and_fix() {
    let dir = TempDir::new(&std::env::temp_dir(), "errs");
    let missing = dir.file("missing.img");
    let shown = missing.display().to_string();

    let e = open_err(&missing, Some(1 << 20), 4096, false);
    assert!(e.contains(&shown) && e.contains("create = true"), "{e}");
    let e = open_err(&missing, None, 4096, true);
    assert!(e.contains(&shown) && e.contains("size"), "{e}");
    let e = open_err(&missing, Some(1000), 4096, true);
    assert!(e.contains("1000") && e.contains("4096"), "{e}");
    let e = open_err(&missing, Some(1 << 20), 1000, true);
    assert!(
        e.contains("block_size = 1000") && e.contains("512 or 4096"),
        "{e}"
    );
    assert!(!missing.exists(), "failed opens create nothing");

    // An existing file is never grown.
    let small = dir.file("small.img");
    std::fs::write(&small, vec![1u8; 8192]).unwrap();
    let e = open_err(&small, Some(1 << 20), 4096, true);
    assert!(
        e.contains("8192") && e.contains("1048576") && e.contains("truncate"),
        "{e}"
    );
    assert_eq!(std::fs::metadata(&small).unwrap().len(), 8192);

    // Without a size the file's length must fit whole blocks.
    let odd = dir.file("odd.img");
    std::fs::write(&odd, vec![1u8; 5000]).unwrap();
    let e = open_err(&odd, None, 4096, false);
    assert!(e.contains("5000") && e.contains("size = 4096"), "{e}");
    let dev = FileDevice::open(FileOptions {
        path: odd,
        size: Some(4096),
        block_size: 4096,
        create: false,
    })
    .expect("explicit size inside the file");
    assert_eq!(dev.geometry().num_blocks, 1);
    assert_eq!(read(&dev, 0, 1), vec![1u8; 4096]);

    let e = open_err(&dir.0, None, 4096, false);
    assert!(
        e.contains("neither a regular file nor a block device"),
        "{e}"
    );
}
