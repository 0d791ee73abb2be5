//! The data descriptor of a fabrics command: in-capsule data (SGL Data Block
//! with the Offset subtype) or a transport data block (data moved by the
//! transport, e.g. R2T/H2CData or C2HData on TCP).

use nvme_wire::sqe::{PSDT_MASK, SGL_DATA_BLOCK_OFFSET, SGL_TRANSPORT_DATA_BLOCK, Sqe};
use nvme_wire::status::{self, Status};

/// What the SGL says about the command's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sgl {
    pub len: u32,
    pub in_capsule: bool,
}

/// Reads the SGL of a command that arrived with `in_capsule_len` bytes of
/// capsule data, on a queue that accepts up to `icd_limit` of them.
pub fn check_sgl(sqe: &Sqe, in_capsule_len: usize, icd_limit: u32) -> Result<Sgl, Status> {
    if sqe.flags & PSDT_MASK == 0 {
        // PRPs have no meaning on a fabric.
        return Err(Status::generic(status::SC_INVALID_FIELD));
    }
    let d = sqe.sgl;
    match d.type_byte {
        SGL_DATA_BLOCK_OFFSET => {
            if d.addr != 0 || d.length > icd_limit {
                return Err(Status::generic(status::SC_SGL_INVALID_OFFSET));
            }
            if d.length as usize != in_capsule_len {
                return Err(Status::generic(status::SC_SGL_INVALID_DATA_LEN));
            }
            Ok(Sgl {
                len: d.length,
                in_capsule: true,
            })
        }
        SGL_TRANSPORT_DATA_BLOCK => {
            if in_capsule_len != 0 {
                return Err(Status::generic(status::SC_SGL_INVALID_DATA_LEN));
            }
            Ok(Sgl {
                len: d.length,
                in_capsule: false,
            })
        }
        _ if d.length == 0 && in_capsule_len == 0 => Ok(Sgl {
            len: 0,
            in_capsule: false,
        }),
        _ => Err(Status::generic(status::SC_SGL_INVALID_TYPE)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvme_wire::sqe::{SglDesc, io_opc};

    fn sqe_with(type_byte: u8, addr: u64, length: u32) -> Sqe {
        let mut s = Sqe::new(io_opc::WRITE, 1);
        s.sgl = SglDesc {
            addr,
            length,
            type_byte,
        };
        s
    }

    #[test]
    fn sgl_rules() {
        assert!(
            check_sgl(&sqe_with(SGL_DATA_BLOCK_OFFSET, 0, 512), 512, 8192)
                .unwrap()
                .in_capsule
        );
        let e = |s: Sqe, n| check_sgl(&s, n, 8192).unwrap_err().sc;
        assert_eq!(
            e(sqe_with(SGL_DATA_BLOCK_OFFSET, 4, 512), 512),
            status::SC_SGL_INVALID_OFFSET
        );
        assert_eq!(
            e(sqe_with(SGL_DATA_BLOCK_OFFSET, 0, 16384), 512),
            status::SC_SGL_INVALID_OFFSET
        );
        assert_eq!(
            e(sqe_with(SGL_DATA_BLOCK_OFFSET, 0, 1024), 512),
            status::SC_SGL_INVALID_DATA_LEN
        );
        assert_eq!(e(sqe_with(0x20, 0, 4096), 0), status::SC_SGL_INVALID_TYPE);
        assert_eq!(
            e(sqe_with(SGL_TRANSPORT_DATA_BLOCK, 0, 4096), 16),
            status::SC_SGL_INVALID_DATA_LEN
        );
        let mut prp = sqe_with(SGL_TRANSPORT_DATA_BLOCK, 0, 4096);
        prp.flags = 0;
        assert_eq!(
            check_sgl(&prp, 0, 8192).unwrap_err().sc,
            status::SC_INVALID_FIELD
        );
        assert_eq!(check_sgl(&sqe_with(0, 0, 0), 0, 8192).unwrap().len, 0);
    }
}
