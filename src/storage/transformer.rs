//! The value transformer: the hook where encryption at rest plugs in, as the
//! Kubernetes `value.Transformer`. Every value written to etcd passes through
//! [`Transformer::to_storage`], every value read through
//! [`Transformer::from_storage`]. The key is passed so an implementation can
//! bind ciphertext to its key (authenticated data), as Kubernetes does.

use bytes::Bytes;

use super::StorageError;

pub trait Transformer: Send + Sync {
    /// Plain value -> bytes stored in etcd.
    fn to_storage(&self, key: &str, value: Bytes) -> Result<Bytes, StorageError>;
    /// Bytes stored in etcd -> plain value.
    // The name pairs with `to_storage` (Kubernetes: TransformFromStorage);
    // it is not a `From`-style constructor.
    #[allow(clippy::wrong_self_convention)]
    fn from_storage(&self, key: &str, value: Bytes) -> Result<Bytes, StorageError>;

    /// [`Transformer::from_storage`], also telling whether the stored bytes
    /// are stale: readable, but not what [`Transformer::to_storage`] would
    /// write now (e.g. encrypted with a key that is no longer the write key).
    /// `GuaranteedUpdate` rewrites a stale value even when the update changes
    /// nothing, which is how kube-apiserver migrates data to a rotated key.
    /// The default never reports staleness.
    #[allow(clippy::wrong_self_convention)]
    fn from_storage_checked(&self, key: &str, value: Bytes) -> Result<(Bytes, bool), StorageError> {
        Ok((self.from_storage(key, value)?, false))
    }
}

/// Stores values as they are (the default).
#[derive(Debug, Default, Clone, Copy)]
pub struct IdentityTransformer;

impl Transformer for IdentityTransformer {
    fn to_storage(&self, _key: &str, value: Bytes) -> Result<Bytes, StorageError> {
        Ok(value)
    }

    fn from_storage(&self, _key: &str, value: Bytes) -> Result<Bytes, StorageError> {
        Ok(value)
    }
}
