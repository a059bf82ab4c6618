//! The one mapping from the library's error enums ([`StorageError`],
//! [`CacherError`]) to `Status` answers. `What` names the resource and object
//! so messages read like Kubernetes': `pods "web" not found`.

use crate::cacher::CacherError;
use crate::storage::StorageError;

use super::api_status::ApiStatus;

/// The resource (plural, group) and object name a request is about.
#[derive(Debug, Clone, Default)]
pub struct What {
    pub plural: String,
    pub group: String,
    pub name: Option<String>,
}

impl What {
    /// `name` (or, without one, the collection) of `resource`.
    pub fn of(resource: &crate::config::ResourceConfig, name: Option<String>) -> What {
        What {
            plural: resource.plural.clone(),
            group: resource.group.clone(),
            name,
        }
    }

    /// `pods "web"` or `pods.apps "web"`, or just the resource.
    fn describe(&self) -> String {
        let res = if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        };
        match &self.name {
            Some(n) => format!("{res} \"{n}\""),
            None => res,
        }
    }

    fn details(&self, status: ApiStatus) -> ApiStatus {
        match &self.name {
            Some(n) => status
                .with_details(n.clone(), self.plural.clone())
                .with_group(&self.group),
            None => status,
        }
    }
}

/// Seconds clients should wait before retrying a 429/503/504.
const RETRY_AFTER_SECS: u64 = 1;

pub fn storage_status(err: StorageError, what: &What) -> ApiStatus {
    match err {
        StorageError::NotFound { .. } => what.details(ApiStatus::not_found(format!(
            "{} not found",
            what.describe()
        ))),
        StorageError::AlreadyExists { .. } => what.details(ApiStatus::already_exists(format!(
            "{} already exists",
            what.describe()
        ))),
        StorageError::Conflict { message, .. } => what.details(ApiStatus::conflict(format!(
            "Operation cannot be fulfilled on {}: {message}",
            what.describe()
        ))),
        StorageError::InvalidObject(m) => {
            ApiStatus::internal(format!("{}: invalid stored object: {m}", what.describe()))
        }
        StorageError::RequestTooLarge(m) => {
            ApiStatus::too_large(format!("{}: {m}", what.describe()))
        }
        StorageError::Compacted {
            requested,
            compacted,
        } => ApiStatus::expired(format!(
            "The resourceVersion for the provided list is too old: {requested} (compacted: {compacted})"
        )),
        StorageError::Unavailable(m) => {
            ApiStatus::service_unavailable(format!("etcd is unavailable: {m}"))
                .with_retry_after(RETRY_AFTER_SECS)
        }
        StorageError::Timeout(m) => ApiStatus::timeout(format!("etcd request timed out: {m}"))
            .with_retry_after(RETRY_AFTER_SECS),
        StorageError::Internal(m) => ApiStatus::internal(m),
        e @ StorageError::Transformation { .. } => ApiStatus::internal(e.to_string()),
    }
}

/// What a GuaranteedUpdate of the REST API fails with: the store's error,
/// mapped with the object's name at the end, or the request's own answer
/// (a 400 or 422 decided by the update fn), passed through untouched.
#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("{0}")]
    Request(ApiStatus),
}

impl From<ApiStatus> for UpdateError {
    fn from(status: ApiStatus) -> Self {
        UpdateError::Request(status)
    }
}

pub fn update_status(err: UpdateError, what: &What) -> ApiStatus {
    match err {
        UpdateError::Storage(e) => storage_status(e, what),
        UpdateError::Request(status) => status,
    }
}

pub fn cacher_status(err: CacherError, what: &What) -> ApiStatus {
    match err {
        CacherError::BadRequest(m) => ApiStatus::bad_request(m),
        CacherError::NotFound => what.details(ApiStatus::not_found(format!(
            "{} not found",
            what.describe()
        ))),
        CacherError::Expired(m) => ApiStatus::expired(m),
        // kube-apiserver's NewTooLargeResourceVersionError: a Timeout whose
        // cause client-go's IsTooLargeResourceVersion looks for.
        CacherError::TooLargeResourceVersion { requested, current } => ApiStatus::timeout(format!(
            "Timeout: Too large resource version: {requested}, current: {current}"
        ))
        .with_cause("ResourceVersionTooLarge", "Too large resource version")
        .with_retry_after(RETRY_AFTER_SECS),
        CacherError::NotReady => ApiStatus::too_many_requests(
            format!("the watch cache of {} is not ready yet", what.plural),
            RETRY_AFTER_SECS,
        ),
        CacherError::Storage(e) => storage_status(e, what),
        CacherError::ShuttingDown => ApiStatus::service_unavailable("the server is shutting down")
            .with_retry_after(RETRY_AFTER_SECS),
        CacherError::Encoding(m) => ApiStatus::internal(m),
    }
}
