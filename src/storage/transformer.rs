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
