//! Patching a stored object: JSON patch (RFC 6902), strategic merge patch,
//! and server-side apply's field ownership ([`field_manager`]). Pure
//! functions of JSON values; the `PATCH` handler calls them.

pub mod field_manager;
pub mod json_patch;
pub mod strategic_merge;
