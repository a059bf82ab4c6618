//! Delete/update preconditions (Kubernetes `storage.Preconditions`): the
//! caller asserts the uid and/or resourceVersion of the object it means, so a
//! delete never hits a same-named object that was recreated meanwhile.

use serde::Deserialize;

use super::{StorageError, StoredObject};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Preconditions {
    /// Must equal the stored object's `metadata.uid`.
    pub uid: Option<String>,
    /// Must equal the stored object's mod_revision.
    pub resource_version: Option<i64>,
}

/// Only the field we need; the rest of the object is ignored.
#[derive(Deserialize)]
struct UidView {
    #[serde(default)]
    metadata: Option<MetaView>,
}

#[derive(Deserialize)]
struct MetaView {
    #[serde(default)]
    uid: Option<String>,
}

impl Preconditions {
    pub fn none() -> Self {
        Self::default()
    }

    pub fn uid(uid: impl Into<String>) -> Self {
        Preconditions {
            uid: Some(uid.into()),
            resource_version: None,
        }
    }

    pub fn resource_version(rv: i64) -> Self {
        Preconditions {
            uid: None,
            resource_version: Some(rv),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.uid.is_none() && self.resource_version.is_none()
    }

    /// Checks the preconditions against `obj` (whose value is the plain,
    /// transformed-back JSON). Mismatch -> `Conflict` with the Kubernetes
    /// wording; an unparsable value when a uid is required -> `InvalidObject`.
    pub fn check(&self, key: &str, obj: &StoredObject) -> Result<(), StorageError> {
        if let Some(want) = &self.uid {
            let invalid = |e: &dyn std::fmt::Display| {
                StorageError::InvalidObject(format!("{key}: cannot read metadata.uid: {e}"))
            };
            // kube-apiserver's protobuf values (`k8s\0...`) are read as their JSON.
            let view: UidView = if crate::object::protobuf::is_protobuf(&obj.value) {
                let json = crate::object::protobuf::decode(&obj.value).map_err(|e| invalid(&e))?;
                serde_json::from_value(json).map_err(|e| invalid(&e))?
            } else {
                serde_json::from_slice(&obj.value).map_err(|e| invalid(&e))?
            };
            let have = view.metadata.and_then(|m| m.uid).unwrap_or_default();
            if *want != have {
                return Err(StorageError::conflict(
                    key,
                    format!(
                        "Precondition failed: UID in precondition: {want}, UID in object meta: {have}"
                    ),
                ));
            }
        }
        if let Some(want) = self.resource_version
            && want != obj.mod_revision
        {
            return Err(StorageError::conflict(
                key,
                format!(
                    "Precondition failed: ResourceVersion in precondition: {want}, ResourceVersion in object meta: {}",
                    obj.mod_revision
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn obj(value: &str, rv: i64) -> StoredObject {
        StoredObject {
            key: "/k".into(),
            value: Bytes::from(value.to_string()),
            mod_revision: rv,
            create_revision: 1,
            version: 1,
            lease: 0,
        }
    }

    #[test]
    fn uid_and_rv() {
        let o = obj(r#"{"metadata":{"uid":"a"}}"#, 7);
        assert!(Preconditions::none().check("/k", &o).is_ok());
        assert!(Preconditions::uid("a").check("/k", &o).is_ok());
        assert!(
            Preconditions::uid("b")
                .check("/k", &o)
                .unwrap_err()
                .is_conflict()
        );
        assert!(Preconditions::resource_version(7).check("/k", &o).is_ok());
        assert!(
            Preconditions::resource_version(6)
                .check("/k", &o)
                .unwrap_err()
                .is_conflict()
        );
        let bad = obj("not json", 7);
        assert!(matches!(
            Preconditions::uid("a").check("/k", &bad),
            Err(StorageError::InvalidObject(_))
        ));
        // rv-only preconditions never parse the value
        assert!(Preconditions::resource_version(7).check("/k", &bad).is_ok());
    }
}
