//! Why a node operation failed, and the HTTP status the API answers it
//! with. The typed variants are the failures callers tell apart (a name
//! that is missing or taken); the others carry the message as written at
//! the place that knows the details.

use axum::http::StatusCode;

use crate::echo::Echo;

/// What a request names: the kind in "no volume X", "volume X already exists".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Object {
    Volume,
    Drive,
}

impl Object {
    pub fn as_str(self) -> &'static str {
        match self {
            Object::Volume => "volume",
            Object::Drive => "drive",
        }
    }
}

impl std::fmt::Display for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An operation's failure, with the HTTP status the API answers with
/// ([`NodeError::status`]).
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The request itself is wrong: fix it and retry.
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    /// The request conflicts with the node's state (in use, exported, ...).
    #[error("{0}")]
    Conflict(String),
    /// The node failed to do something it should have been able to do.
    #[error("{0}")]
    Internal(String),
    /// Something the answer needs cannot be reached now (etcd): retry later.
    #[error("{0}")]
    Unavailable(String),
    /// No volume or drive of that name on this node.
    #[error("no {kind} {}; list them with `flashpool {kind} list`", Echo(name))]
    Missing { kind: Object, name: String },
    /// The name is taken.
    #[error("{kind} {name} already exists; pick another name")]
    AlreadyExists { kind: Object, name: String },
}

impl NodeError {
    /// The status the API answers this failure with.
    pub fn status(&self) -> StatusCode {
        match self {
            NodeError::BadRequest(_) => StatusCode::BAD_REQUEST,
            NodeError::NotFound(_) | NodeError::Missing { .. } => StatusCode::NOT_FOUND,
            NodeError::Conflict(_) | NodeError::AlreadyExists { .. } => StatusCode::CONFLICT,
            NodeError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            NodeError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// No volume `name` on this node.
    pub fn no_volume(name: &str) -> NodeError {
        NodeError::Missing {
            kind: Object::Volume,
            name: name.to_string(),
        }
    }

    /// No drive `name` on this node.
    pub fn no_drive(name: &str) -> NodeError {
        NodeError::Missing {
            kind: Object::Drive,
            name: name.to_string(),
        }
    }
}

pub type NodeResult<T> = Result<T, NodeError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_errors_keep_their_words_and_status() {
        let e = NodeError::no_volume("v\n1");
        assert_eq!(
            e.to_string(),
            "no volume \"v\\n1\"; list them with `flashpool volume list`"
        );
        assert_eq!(e.status(), StatusCode::NOT_FOUND);
        let e = NodeError::no_drive("d0");
        assert_eq!(
            e.to_string(),
            "no drive \"d0\"; list them with `flashpool drive list`"
        );
        let e = NodeError::AlreadyExists {
            kind: Object::Volume,
            name: "v0".into(),
        };
        assert_eq!(e.to_string(), "volume v0 already exists; pick another name");
        assert_eq!(e.status(), StatusCode::CONFLICT);
    }
}
