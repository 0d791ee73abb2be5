//! Tests of `forward_block_device!`: every method reaches the inner device
//! unless listed, listed methods stay the decorator's own, and the
//! optional-device form answers with the trait's defaults without one.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::{
    AlignedBuf, BlockDevice, BlockError, BlockOp, Geometry, IoFuture, IoRequest, RecordKind,
};

/// Every `BlockDevice` method, by name: a method added to the trait is added
/// here and to the macro.
const ALL: [&str; 10] = [
    "geometry",
    "submit",
    "prefetch",
    "deallocate_reads_zeroes",
    "allocated_blocks",
    "describe",
    "shutdown",
    "keeps_records",
    "load_record",
    "store_record",
];

/// Records each call and answers with values no trait default gives.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<&'static str>>,
}

impl Recorder {
    fn note(&self, m: &'static str) {
        self.calls.lock().push(m);
    }
    fn take(&self) -> Vec<&'static str> {
        std::mem::take(&mut *self.calls.lock())
    }
}

impl BlockDevice for Recorder {
    fn geometry(&self) -> Geometry {
        self.note("geometry");
        Geometry {
            block_size: 512,
            num_blocks: 77,
        }
    }
    fn submit(&self, req: IoRequest) -> IoFuture {
        self.note("submit");
        IoFuture::ready(req.buf, Err(BlockError::NoSpace))
    }
    fn prefetch(&self, lba: u64, blocks: u32) {
        assert_eq!((lba, blocks), (5, 6));
        self.note("prefetch");
    }
    fn deallocate_reads_zeroes(&self) -> bool {
        self.note("deallocate_reads_zeroes");
        true
    }
    fn allocated_blocks(&self) -> Option<u64> {
        self.note("allocated_blocks");
        Some(9)
    }
    fn describe(&self) -> String {
        self.note("describe");
        "recorder".into()
    }
    fn shutdown(&self) -> Result<(), BlockError> {
        self.note("shutdown");
        Err(BlockError::NoSpace)
    }
    fn keeps_records(&self) -> bool {
        self.note("keeps_records");
        true
    }
    fn load_record(&self, _kind: RecordKind) -> Result<Option<Vec<u8>>, BlockError> {
        self.note("load_record");
        Ok(Some(vec![1, 2, 3]))
    }
    fn store_record(&self, _kind: RecordKind, data: &[u8]) -> Result<(), BlockError> {
        assert_eq!(data, [4, 5]);
        self.note("store_record");
        Ok(())
    }
}

/// Calls every method once, in `ALL`'s order; checks the forwarded answers.
fn call_all(dev: &dyn BlockDevice) {
    dev.geometry();
    let done = crate::block_on(dev.submit(IoRequest {
        op: BlockOp::Read,
        lba: 0,
        blocks: 1,
        buf: AlignedBuf::new(512),
    }));
    assert!(matches!(done.result, Err(BlockError::NoSpace)));
    dev.prefetch(5, 6);
    dev.deallocate_reads_zeroes();
    dev.allocated_blocks();
    dev.describe();
    let _ = dev.shutdown();
    dev.keeps_records();
    let _ = dev.load_record(RecordKind::Reservations);
    let _ = dev.store_record(RecordKind::Reservations, &[4, 5]);
}

struct Plain(Arc<Recorder>);

impl BlockDevice for Plain {
    crate::forward_block_device!(self => self.0);
}

#[test]
fn forwards_every_method() {
    let rec = Arc::new(Recorder::default());
    let dev = Plain(rec.clone());
    call_all(&dev);
    assert_eq!(rec.take(), ALL);
    assert_eq!(dev.geometry().num_blocks, 77);
    assert_eq!(dev.allocated_blocks(), Some(9));
    assert!(dev.keeps_records());
    assert_eq!(
        dev.load_record(RecordKind::Reservations).unwrap(),
        Some(vec![1, 2, 3])
    );
    assert!(dev.shutdown().is_err());
    assert_eq!(dev.describe(), "recorder");
}

struct Own {
    inner: Box<Recorder>,
}

impl BlockDevice for Own {
    crate::forward_block_device!(self => self.inner, except [describe, shutdown]);

    fn describe(&self) -> String {
        "own".into()
    }
    // shutdown: the trait's default (Ok, the inner device is not ours).
}

#[test]
fn listed_methods_stay_the_decorators() {
    let dev = Own {
        inner: Box::default(),
    };
    call_all(&dev);
    let want: Vec<_> = ALL
        .into_iter()
        .filter(|m| !["describe", "shutdown"].contains(m))
        .collect();
    assert_eq!(dev.inner.take(), want);
    assert_eq!(dev.describe(), "own");
    assert!(dev.shutdown().is_ok());
}

struct Maybe(Option<Arc<Recorder>>);

impl BlockDevice for Maybe {
    crate::forward_block_device!(self => if let Some(d) = self.0.as_ref(), except [
        geometry,
        submit,
        deallocate_reads_zeroes,
        describe,
    ]);

    fn geometry(&self) -> Geometry {
        Geometry {
            block_size: 512,
            num_blocks: 1,
        }
    }
    fn submit(&self, req: IoRequest) -> IoFuture {
        IoFuture::ready(req.buf, Err(BlockError::NoSpace))
    }
    fn deallocate_reads_zeroes(&self) -> bool {
        false
    }
    fn describe(&self) -> String {
        "maybe".into()
    }
}

#[test]
fn optional_device_forwards_while_present_and_defaults_without() {
    let rec = Arc::new(Recorder::default());
    let dev = Maybe(Some(rec.clone()));
    call_all(&dev);
    let want: Vec<_> = ALL
        .into_iter()
        .filter(|m| !["geometry", "submit", "deallocate_reads_zeroes", "describe"].contains(m))
        .collect();
    assert_eq!(rec.take(), want);
    assert!(dev.keeps_records());

    let dev = Maybe(None);
    call_all(&dev);
    assert_eq!(dev.allocated_blocks(), None);
    assert!(!dev.keeps_records());
    assert!(dev.shutdown().is_ok());
    assert_eq!(dev.load_record(RecordKind::Reservations).unwrap(), None);
    let e = dev
        .store_record(RecordKind::Reservations, &[4, 5])
        .unwrap_err();
    assert!(
        e.to_string().contains("maybe keeps no Reservations record"),
        "{e}"
    );
}
