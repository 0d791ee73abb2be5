//! Unit tests of the controller's bring-up helpers: the errors a refused
//! Connect turns into, and the host identity.

use super::*;
use crate::options::default_host_identity;
use nvme_wire::fabrics::NQN_MAX_LEN;
use nvme_wire::status::Status;

fn resp(status: Status, dw0: u32) -> Response {
    Response {
        status,
        dw0,
        dw1: 0,
    }
}

#[test]
fn connect_errors_name_the_cause() {
    let a: SocketAddr = "127.0.0.1:4420".parse().unwrap();
    let e = connect_error(
        a,
        0,
        resp(Status::cmd_specific(0x82), (1 << 16) | 256),
        "nqn.x",
        "nqn.h",
    );
    assert!(matches!(e, HostError::UnknownSubsystem { .. }), "{e}");
    let e = connect_error(
        a,
        0,
        resp(Status::cmd_specific(0x84), (1 << 16) | 512),
        "nqn.x",
        "nqn.h",
    );
    assert!(matches!(e, HostError::HostNotAllowed { .. }));
    assert!(
        e.to_string().contains("nqn.h is not allowed on nqn.x"),
        "{e}"
    );
    let e = connect_error(a, 3, resp(Status::cmd_specific(0x82), 44), "nqn.x", "nqn.h");
    assert!(e.to_string().contains("SQSIZE"), "{e}");
    let e = connect_error(a, 0, resp(Status::cmd_specific(0x81), 0), "nqn.x", "nqn.h");
    assert!(e.to_string().contains("Connect Controller Busy"), "{e}");
}

#[test]
fn host_identity_is_stable_and_valid() {
    let (n1, id1) = default_host_identity();
    let (n2, id2) = default_host_identity();
    assert_eq!((n1.clone(), id1), (n2, id2));
    assert!(n1.starts_with("nqn.") && n1.len() <= NQN_MAX_LEN, "{n1}");
}
