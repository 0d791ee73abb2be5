//! Helpers around etcd calls shared by the session and its tasks: retrying
//! transient errors (a leader change, a member going away), mapping etcd's
//! errors to [`ClusterError`], and the JSON values stored under the keys.

use std::future::Future;
use std::time::{Duration, Instant};

use etcd_client::{KeyValue, TxnOpResponse};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{ClusterConfig, ClusterError};

/// How long one operation keeps retrying transient etcd errors (leader
/// change, a member going away) before it reports them.
const RETRY_FOR: Duration = Duration::from_secs(4);

pub(crate) fn etcd_err(cfg: &ClusterConfig, what: &str, e: etcd_client::Error) -> ClusterError {
    if let etcd_client::Error::GRpcStatus(s) = &e
        && s.code() == tonic::Code::NotFound
        && s.message().contains("lease")
    {
        return ClusterError::LeaseLost(format!("{what}: {}", s.message()));
    }
    ClusterError::Etcd(format!(
        "{what} (endpoints {}): {e}",
        cfg.endpoints.join(",")
    ))
}

/// Errors worth retrying: the request may not have reached a leader.
pub(crate) fn transient(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match e {
        E::TransportError(_) | E::IoError(_) => true,
        E::GRpcStatus(s) => matches!(
            s.code(),
            tonic::Code::Unavailable
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Cancelled
                | tonic::Code::Unknown
                | tonic::Code::Internal
        ),
        _ => false,
    }
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("serialising a plain struct cannot fail")
}

pub(crate) fn decode<T: DeserializeOwned>(kv: &KeyValue) -> Result<T, ClusterError> {
    serde_json::from_slice(kv.value()).map_err(|e| ClusterError::Decode {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        err: e.to_string(),
    })
}

pub(crate) fn txn_gets(resp: &etcd_client::TxnResponse) -> Vec<Vec<KeyValue>> {
    resp.op_responses()
        .into_iter()
        .filter_map(|r| match r {
            TxnOpResponse::Get(g) => Some(g.kvs().to_vec()),
            _ => None,
        })
        .collect()
}

pub(crate) async fn retry<T, F, Fut>(
    cfg: &ClusterConfig,
    what: &str,
    mut f: F,
) -> Result<T, ClusterError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    let give_up = Instant::now() + RETRY_FOR;
    let mut backoff = Duration::from_millis(25);
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if transient(&e) && Instant::now() + backoff < give_up => {
                tracing::debug!("{what}: {e}; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(200));
            }
            Err(e) => return Err(etcd_err(cfg, what, e)),
        }
    }
}
