//! Null backend: writes vanish, reads return zeroes. For protocol benchmarks,
//! where the storage must cost nothing.

use crate::{
    BlockDevice, BlockError, BlockOp, Geometry, IoFuture, IoRequest, check_request, human_size,
};

/// A device that stores nothing.
pub struct NullDevice {
    geo: Geometry,
}

impl NullDevice {
    /// `size_bytes` must be a non-zero multiple of `block_size` (512 or 4096).
    pub fn new(size_bytes: u64, block_size: u32) -> Result<NullDevice, BlockError> {
        let geo = Geometry::checked("null device", size_bytes, block_size)?;
        Ok(NullDevice { geo })
    }
}

impl BlockDevice for NullDevice {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn submit(&self, req: IoRequest) -> IoFuture {
        if let Err(e) = check_request(self.geo, &req) {
            return IoFuture::ready(req.buf, Err(e));
        }
        let mut buf = req.buf;
        if req.op == BlockOp::Read {
            let n = req.blocks as usize * self.geo.block_size as usize;
            buf[..n].fill(0);
        }
        IoFuture::ready(buf, Ok(()))
    }

    fn deallocate_reads_zeroes(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        format!(
            "null ({}, {} B blocks, discards writes)",
            human_size(self.geo.size_bytes()),
            self.geo.block_size
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    #[test]
    fn reads_zeroes_discards_writes() {
        let dev = NullDevice::new(1 << 40, 4096).unwrap();
        assert_eq!(dev.geometry().num_blocks, 1 << 28);
        write(&dev, 12345, &[0xEEu8; 8192]);
        let got = read(&dev, 12345, 2);
        assert!(got.iter().all(|&b| b == 0));
        // Only the request's blocks are touched; the rest of the buffer is left alone.
        let mut buf = buf_of(3 * 512);
        buf.fill(1);
        let done = io(
            &NullDevice::new(1 << 20, 512).unwrap(),
            BlockOp::Read,
            0,
            2,
            buf,
        );
        done.result.unwrap();
        assert!(done.buf[..1024].iter().all(|&b| b == 0));
        assert!(done.buf[1024..].iter().all(|&b| b == 1));
        assert!(dev.deallocate_reads_zeroes());
        assert!(dev.describe().contains("1 TiB"), "{}", dev.describe());
    }

    #[test]
    fn bad_requests_and_config() {
        check_bad_requests(&NullDevice::new(64 * 512, 512).unwrap());
        assert!(NullDevice::new(4095, 4096).is_err());
        assert!(NullDevice::new(4096, 2048).is_err());
    }
}
