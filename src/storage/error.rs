//! Storage errors, shaped after the Kubernetes `storage.StorageError` codes so
//! the API layer can map each one to a `Status` (404, 409, 410, 5xx, ...).

/// etcd's `rpctypes.ErrGRPCCompacted`.
const ETCD_COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";
/// etcd's `rpctypes.ErrGRPCRequestTooLarge` (a request over `--max-request-bytes`).
const ETCD_REQUEST_TOO_LARGE: &str = "etcdserver: request is too large";
/// grpc-go's refusal of a message over the server's receive limit
/// (`grpc: received message larger than max (N vs. M)`).
const GRPC_MESSAGE_TOO_LARGE: &str = "grpc: received message larger than max";

/// An error of the etcd3 store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
    #[error("key not found: {key}")]
    NotFound { key: String },
    #[error("key already exists: {key}")]
    AlreadyExists { key: String },
    #[error("conflict on {key}: {message}")]
    Conflict { key: String, message: String },
    /// A stored key or value cannot be read (a non-UTF-8 key, a value the
    /// transformer rejects), or a request names keys outside what it may.
    #[error("invalid object: {0}")]
    InvalidObject(String),
    /// etcd refused a write as larger than its request limit
    /// (`--max-request-bytes`); the client's object is too large (413).
    #[error("request too large: {0}")]
    RequestTooLarge(String),
    /// The requested revision is older than etcd's compaction point.
    /// `compacted` is 0 when etcd did not tell us the compaction revision.
    #[error("required revision {requested} has been compacted (compacted revision: {compacted})")]
    Compacted { requested: i64, compacted: i64 },
    #[error("etcd unavailable: {0}")]
    Unavailable(String),
    #[error("etcd request timed out: {0}")]
    Timeout(String),
    #[error("internal storage error: {0}")]
    Internal(String),
    /// A stored value the transformer (encryption at rest) cannot read, or a
    /// value it cannot encrypt. Typed so callers can count and skip it.
    #[error("unable to transform key {key:?}: {error}")]
    Transformation {
        key: String,
        error: super::encryption::TransformError,
    },
}

impl StorageError {
    pub fn not_found(key: &str) -> Self {
        StorageError::NotFound {
            key: key.to_string(),
        }
    }

    pub fn already_exists(key: &str) -> Self {
        StorageError::AlreadyExists {
            key: key.to_string(),
        }
    }

    pub fn conflict(key: &str, message: impl Into<String>) -> Self {
        StorageError::Conflict {
            key: key.to_string(),
            message: message.into(),
        }
    }

    /// The Kubernetes wording for a lost compare-and-swap, so clients that
    /// match on it (and humans) recognise it.
    pub(crate) fn modified(key: &str) -> Self {
        Self::conflict(
            key,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, StorageError::NotFound { .. })
    }

    pub fn is_conflict(&self) -> bool {
        matches!(self, StorageError::Conflict { .. })
    }

    /// True for errors worth retrying later (etcd down, slow or overloaded).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StorageError::Unavailable(_) | StorageError::Timeout(_)
        )
    }

    /// Maps an etcd-client error. `requested` is the revision a read asked
    /// for (0 if none), used to fill [`StorageError::Compacted`].
    pub(crate) fn from_etcd(op: &str, requested: i64, err: etcd_client::Error) -> Self {
        use etcd_client::Error as E;
        match err {
            E::GRpcStatus(status) => Self::from_status(op, requested, &status),
            // A transport error means we never got an answer: etcd is down,
            // unreachable or the connection broke.
            E::TransportError(e) => StorageError::Unavailable(format!("{op}: {e}")),
            E::IoError(e) => StorageError::Unavailable(format!("{op}: {e}")),
            E::InvalidUri(e) => StorageError::Internal(format!("{op}: invalid endpoint: {e}")),
            E::InvalidArgs(e) => StorageError::Internal(format!("{op}: invalid arguments: {e}")),
            other => StorageError::Internal(format!("{op}: {other}")),
        }
    }

    /// Maps an etcd gRPC status. This is the one place that reads etcd's
    /// error messages: etcd tells its errors apart only by message within a
    /// gRPC code, so its exact `rpctypes` texts (`ETCD_*` below) are matched
    /// here, once, and everything above this layer matches variants.
    pub(crate) fn from_status(op: &str, requested: i64, status: &tonic::Status) -> Self {
        use tonic::Code;
        let msg = status.message();
        match status.code() {
            Code::OutOfRange if msg == ETCD_COMPACTED => StorageError::Compacted {
                requested,
                compacted: 0,
            },
            Code::InvalidArgument if msg == ETCD_REQUEST_TOO_LARGE => {
                StorageError::RequestTooLarge(format!("{op}: {msg}"))
            }
            // Beyond `--max-request-bytes` plus gRPC's overhead allowance,
            // etcd's gRPC server refuses the message before etcd sees it.
            Code::ResourceExhausted if msg.starts_with(GRPC_MESSAGE_TOO_LARGE) => {
                StorageError::RequestTooLarge(format!("{op}: {msg}"))
            }
            Code::DeadlineExceeded => StorageError::Timeout(format!("{op}: {msg}")),
            // Cancelled shows up when the connection drops under a request.
            Code::Unavailable | Code::Cancelled | Code::Aborted | Code::ResourceExhausted => {
                StorageError::Unavailable(format!("{op}: {msg}"))
            }
            // tonic reports a broken or refused connection as Unknown
            // "transport error"; etcd reports leader trouble as Unknown too.
            Code::Unknown
                if msg.contains("transport error")
                    || msg.contains("connection")
                    || msg.contains("leader changed")
                    || msg.contains("no leader")
                    || msg.contains("timed out") =>
            {
                StorageError::Unavailable(format!("{op}: {msg}"))
            }
            // Any other refusal of a request we built (empty key, too many
            // txn operations, ...) is our bug, not the client's.
            code => StorageError::Internal(format!("{op}: {code:?}: {msg}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_mapping() {
        let e = StorageError::from_etcd(
            "list",
            5,
            etcd_client::Error::GRpcStatus(tonic::Status::out_of_range(
                "etcdserver: mvcc: required revision has been compacted",
            )),
        );
        assert_eq!(
            e,
            StorageError::Compacted {
                requested: 5,
                compacted: 0
            }
        );
        let e = StorageError::from_etcd(
            "get",
            0,
            etcd_client::Error::GRpcStatus(tonic::Status::unavailable("down")),
        );
        assert!(matches!(e, StorageError::Unavailable(_)));
        let e = StorageError::from_etcd(
            "get",
            0,
            etcd_client::Error::GRpcStatus(tonic::Status::deadline_exceeded("slow")),
        );
        assert!(matches!(e, StorageError::Timeout(_)));
        assert!(e.is_transient());
        let status = |code, msg: &str| {
            StorageError::from_etcd(
                "put",
                0,
                etcd_client::Error::GRpcStatus(tonic::Status::new(code, msg)),
            )
        };
        assert!(matches!(
            status(
                tonic::Code::InvalidArgument,
                "etcdserver: request is too large"
            ),
            StorageError::RequestTooLarge(_)
        ));
        assert!(matches!(
            status(
                tonic::Code::ResourceExhausted,
                "grpc: received message larger than max (3145828 vs. 2097152)"
            ),
            StorageError::RequestTooLarge(_)
        ));
        // Other refusals are not the client's fault, whatever they say.
        assert!(matches!(
            status(
                tonic::Code::InvalidArgument,
                "etcdserver: too many operations in txn request"
            ),
            StorageError::Internal(_)
        ));
        assert!(matches!(
            status(
                tonic::Code::ResourceExhausted,
                "etcdserver: too many requests"
            ),
            StorageError::Unavailable(_)
        ));
    }
}
