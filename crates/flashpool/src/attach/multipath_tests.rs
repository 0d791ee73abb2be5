//! Path choice and retries, with paths to one RAM device whose ANA state
//! and failures the test sets (a cluster volume seen through two nodes).

use std::sync::atomic::AtomicU32;

use blockdev::{AlignedBuf, BlockOp, MemDevice};
use nvme_wire::log_page::ana::STATE_INACCESSIBLE;

use super::*;

struct FakePath {
    name: &'static str,
    dev: Arc<MemDevice>,
    state: AtomicU8,
    /// I/O fails (as a dead node's or a deposed owner's does).
    broken: AtomicBool,
    ios: AtomicU32,
}

impl FakePath {
    fn new(name: &'static str, dev: &Arc<MemDevice>, state: u8) -> Arc<FakePath> {
        Arc::new(FakePath {
            name,
            dev: dev.clone(),
            state: AtomicU8::new(state),
            broken: AtomicBool::new(false),
            ios: AtomicU32::new(0),
        })
    }
    fn set(&self, state: u8, broken: bool) {
        self.state.store(state, Ordering::SeqCst);
        self.broken.store(broken, Ordering::SeqCst);
    }
}

impl BlockDevice for FakePath {
    fn geometry(&self) -> Geometry {
        self.dev.geometry()
    }
    fn submit(&self, req: IoRequest) -> IoFuture {
        self.ios.fetch_add(1, Ordering::SeqCst);
        if self.broken.load(Ordering::SeqCst) {
            let e = std::io::Error::other(format!("{}: ANA Inaccessible", self.name));
            return IoFuture::ready(req.buf, Err(BlockError::Io(e)));
        }
        self.dev.submit(req)
    }
    fn deallocate_reads_zeroes(&self) -> bool {
        true
    }
    fn describe(&self) -> String {
        self.name.into()
    }
}

impl AnaPath for FakePath {
    fn ana_state(&self) -> AnaFuture<'_> {
        let s = self.state.load(Ordering::SeqCst);
        Box::pin(async move { Ok(Some(s)) })
    }
}

fn block(fill: u8) -> AlignedBuf {
    let mut b = AlignedBuf::new(512);
    b.set_len(512);
    b.fill(fill);
    b
}

async fn write(m: &Multipath, lba: u64, fill: u8) -> Result<(), BlockError> {
    m.submit(IoRequest {
        op: BlockOp::Write { fua: false },
        lba,
        blocks: 1,
        buf: block(fill),
    })
    .await
    .result
}

async fn read(m: &Multipath, lba: u64) -> u8 {
    let done = m
        .submit(IoRequest {
            op: BlockOp::Read,
            lba,
            blocks: 1,
            buf: block(0),
        })
        .await;
    done.result.unwrap();
    assert!(done.buf.iter().all(|&b| b == done.buf[0]));
    done.buf[0]
}

fn setup(a_state: u8, b_state: u8) -> (Arc<FakePath>, Arc<FakePath>, Vec<Arc<dyn AnaPath>>) {
    let dev = Arc::new(MemDevice::new(1 << 20, 512).unwrap());
    let a = FakePath::new("node-a", &dev, a_state);
    let b = FakePath::new("node-b", &dev, b_state);
    let paths: Vec<Arc<dyn AnaPath>> = vec![a.clone(), b.clone()];
    (a, b, paths)
}

#[test]
fn pick_prefers_the_current_optimized_then_any_optimized_then_non_optimized() {
    const O: u8 = STATE_OPTIMIZED;
    const N: u8 = STATE_NON_OPTIMIZED;
    const I: u8 = STATE_INACCESSIBLE;
    assert_eq!(pick(&[O, O], 1), 1);
    assert_eq!(pick(&[O, O], NONE), 0);
    assert_eq!(pick(&[I, O], 0), 1);
    assert_eq!(pick(&[N, I, O], 0), 2);
    assert_eq!(pick(&[I, N], NONE), 1);
    assert_eq!(pick(&[I, UNKNOWN], 1), NONE);
    assert_eq!(pick(&[], NONE), NONE);
}

#[tokio::test]
async fn io_goes_to_the_optimized_path() {
    let (a, b, paths) = setup(STATE_INACCESSIBLE, STATE_OPTIMIZED);
    a.set(STATE_INACCESSIBLE, true);
    let m = Multipath::new(paths, Duration::from_secs(2)).await;
    assert_eq!(m.active(), Some(1));
    write(&m, 3, 0x5a).await.unwrap();
    assert_eq!(read(&m, 3).await, 0x5a);
    assert_eq!(
        a.ios.load(Ordering::SeqCst),
        0,
        "the inaccessible path got I/O"
    );
    assert_eq!(b.ios.load(Ordering::SeqCst), 2);
}

/// The owner dies (its I/O fails) and the survivor turns Optimized a little
/// later: the request in flight waits and completes there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_path_is_left_for_the_new_owner() {
    let (a, b, paths) = setup(STATE_OPTIMIZED, STATE_INACCESSIBLE);
    b.set(STATE_INACCESSIBLE, true);
    let m = Multipath::new(paths, Duration::from_secs(5)).await;
    assert_eq!(m.active(), Some(0));
    write(&m, 1, 0x11).await.unwrap();
    a.set(STATE_INACCESSIBLE, true);
    let b2 = b.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        b2.set(STATE_OPTIMIZED, false);
    });
    let t = std::time::Instant::now();
    write(&m, 2, 0x22).await.unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(m.active(), Some(1));
    assert_eq!((read(&m, 1).await, read(&m, 2).await), (0x11, 0x22));
}

/// A planned move: ANA changes with no error; the poller follows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ana_change_moves_io_without_an_error() {
    let (a, b, paths) = setup(STATE_OPTIMIZED, STATE_INACCESSIBLE);
    let m = Multipath::new(paths, Duration::from_secs(5)).await;
    write(&m, 0, 1).await.unwrap();
    a.set(STATE_INACCESSIBLE, false);
    b.set(STATE_OPTIMIZED, false);
    tokio::time::sleep(POLL * 3).await;
    assert_eq!(m.active(), Some(1));
    let before = a.ios.load(Ordering::SeqCst);
    write(&m, 0, 2).await.unwrap();
    assert_eq!(
        a.ios.load(Ordering::SeqCst),
        before,
        "I/O still went to the old owner"
    );
    assert_eq!(read(&m, 0).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_usable_path_fails_after_the_limit_and_real_answers_are_not_retried() {
    let (a, b, paths) = setup(STATE_OPTIMIZED, STATE_INACCESSIBLE);
    b.set(STATE_INACCESSIBLE, true);
    let m = Multipath::new(paths, Duration::from_millis(400)).await;
    // Out of range: refused at once, on no path.
    let r = m
        .submit(IoRequest {
            op: BlockOp::Read,
            lba: 1 << 20,
            blocks: 1,
            buf: block(0),
        })
        .await;
    assert!(matches!(r.result, Err(BlockError::OutOfRange { .. })));
    a.set(STATE_INACCESSIBLE, true);
    let t = std::time::Instant::now();
    let e = write(&m, 0, 9).await.unwrap_err();
    assert!(
        t.elapsed() >= Duration::from_millis(350),
        "{:?}",
        t.elapsed()
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert!(e.to_string().contains("ANA Inaccessible"), "{e}");
}
