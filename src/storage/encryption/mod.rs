//! Encryption at rest, compatible with kube-apiserver's
//! `--encryption-provider-config` (k8s.io/apiserver/pkg/server/options/encryptionconfig).
//!
//! The file is an `EncryptionConfiguration` (YAML or JSON). Each entry maps
//! resources (`secrets`, `deployments.apps`, `*.apps`, `*.` for the core
//! group, `*.*`) to an ordered provider list: the first provider encrypts
//! writes, every provider is tried on reads (key rotation). Values carry
//! kube-apiserver's prefix `k8s:enc:<provider>:v1:<key name>:`, so either
//! side reads what the other wrote.
//!
//! [`EncryptionTransformer`] is one [`Transformer`] for the whole store: it
//! picks the resource from the etcd key prefix (the configured resources'
//! `key_prefix`), as kube-apiserver picks a transformer per GroupResource.

mod providers;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use prometheus::IntCounter;
use serde::Deserialize;

use super::{StorageError, Transformer};
use crate::config::ResourceConfig;
use providers::{Cipher, CipherError};

/// The prefix of every encrypted value (kube-apiserver's `k8s:enc:`).
const ENCRYPTED_PREFIX: &[u8] = b"k8s:enc:";

/// Why a value could not be transformed. Carries provider and key names,
/// never data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransformError {
    /// No configured provider has the value's prefix (e.g. encrypted with a
    /// key that is not configured), or identity met an encrypted value.
    #[error("no configured encryption provider can read the value{stored_with}")]
    NoMatchingProvider {
        /// ` (stored with k8s:enc:aesgcm:v1:key9)`, or empty.
        stored_with: String,
    },
    #[error("{provider}: the stored data is shorter than the cipher requires")]
    Truncated { provider: String },
    #[error("{provider}: decryption failed (wrong key or tampered value)")]
    DecryptFailed { provider: String },
    #[error("{provider}: encryption failed")]
    EncryptFailed { provider: String },
}

impl TransformError {
    /// The `reason` label of `watchcache_transformation_failures_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            TransformError::NoMatchingProvider { .. } => "no_matching_provider",
            TransformError::Truncated { .. } => "truncated",
            TransformError::DecryptFailed { .. } => "decrypt_failed",
            TransformError::EncryptFailed { .. } => "encrypt_failed",
        }
    }
}

/// An invalid `--encryption-provider-config`; names the file and the field.
#[derive(Debug, thiserror::Error)]
pub enum EncryptionConfigError {
    #[error("{file}: cannot read: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}: {message}")]
    Parse { file: String, message: String },
    #[error("{file}: field `{field}`: {message}")]
    Invalid {
        file: String,
        field: String,
        message: String,
    },
}

// ---- the file format (apiserver.config.k8s.io/v1) ------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct EncryptionConfiguration {
    api_version: String,
    kind: String,
    #[serde(default)]
    resources: Vec<ResourceEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResourceEntry {
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    providers: Vec<ProviderEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProviderEntry {
    aesgcm: Option<KeysConfig>,
    aescbc: Option<KeysConfig>,
    secretbox: Option<KeysConfig>,
    /// Only its presence matters (`identity: {}`).
    identity: Option<serde::de::IgnoredAny>,
    /// Refused with its own error (no KMS plugin support).
    kms: Option<serde::de::IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysConfig {
    #[serde(default)]
    keys: Vec<KeyConfig>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyConfig {
    #[serde(default, deserialize_with = "null_as_empty")]
    name: String,
    #[serde(default, deserialize_with = "null_as_empty")]
    secret: String,
}

/// `name:` with no value is YAML's null; Go (kube-apiserver) reads a null
/// into a string as "", which validation then reports as missing.
fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

// ---- the transformer -------------------------------------------------------

/// One provider with one key (a provider with three keys is three of these,
/// in order, as in kube-apiserver).
struct Provider {
    /// `k8s:enc:aesgcm:v1:key1:`; empty for identity.
    prefix: Vec<u8>,
    /// `aesgcm key key1`, for errors.
    name: String,
    /// `None` for identity.
    cipher: Option<Cipher>,
}

/// The ordered providers of one resource.
struct Chain {
    providers: Vec<Arc<Provider>>,
}

impl Chain {
    fn identity() -> Chain {
        Chain {
            providers: vec![Arc::new(Provider {
                prefix: Vec::new(),
                name: "identity".into(),
                cipher: None,
            })],
        }
    }

    /// Identity returns the value itself (a shared `Bytes`, no copy): it is
    /// the default for every resource, on every read and write.
    fn encrypt(&self, key: &str, value: &Bytes) -> Result<Bytes, TransformError> {
        // A chain is never empty: the config requires a provider per entry.
        let Some(first) = self.providers.first() else {
            return Ok(value.clone());
        };
        match &first.cipher {
            None => Ok(value.clone()),
            Some(c) => {
                let sealed =
                    c.seal(value, key.as_bytes())
                        .map_err(|_| TransformError::EncryptFailed {
                            provider: first.name.clone(),
                        })?;
                Ok(Bytes::from([&first.prefix[..], &sealed].concat()))
            }
        }
    }

    /// Every provider whose prefix the value has is tried in order, going on
    /// after a failure; the first that reads it wins (kube-apiserver's
    /// prefixTransformers). Prefixes can overlap (key names `k` and `k:1`,
    /// or one name twice), so the first match is not necessarily the key. The
    /// flag is staleness: a provider other than the first (the write key)
    /// read it, so a write now would store different bytes.
    fn decrypt(&self, key: &str, value: &Bytes) -> Result<(Bytes, bool), TransformError> {
        let mut first_err = None;
        for (i, p) in self.providers.iter().enumerate() {
            let stale = i != 0;
            let Some(data) = value.strip_prefix(&p.prefix[..]) else {
                continue;
            };
            let Some(cipher) = &p.cipher else {
                // identity reads anything that is not encrypted.
                if value.starts_with(ENCRYPTED_PREFIX) {
                    continue;
                }
                return Ok((value.clone(), stale));
            };
            match cipher.open(data, key.as_bytes()) {
                Ok(v) => return Ok((Bytes::from(v), stale)),
                Err(e) => {
                    let provider = p.name.clone();
                    first_err.get_or_insert(match e {
                        CipherError::Truncated => TransformError::Truncated { provider },
                        CipherError::Failed | CipherError::Random => {
                            TransformError::DecryptFailed { provider }
                        }
                    });
                }
            }
        }
        Err(
            first_err.unwrap_or_else(|| TransformError::NoMatchingProvider {
                stored_with: stored_with(value),
            }),
        )
    }
}

/// ` (stored with k8s:enc:<provider>:v1:<key>)` for an encrypted value: the
/// prefix names provider and key, never data.
fn stored_with(value: &[u8]) -> String {
    if !value.starts_with(ENCRYPTED_PREFIX) {
        return String::new();
    }
    // k8s:enc:<provider>:v1:<name>: has five ':' before the data (a key
    // name with its own ':' shows up to its first one: the data that follows
    // cannot tell where a name ends).
    let mut colons = 0;
    let end = value
        .iter()
        .take(128)
        .position(|&b| {
            if b == b':' {
                colons += 1;
            }
            colons == 5
        })
        .unwrap_or(0);
    let prefix = &value[..end];
    if end == 0 || !prefix.iter().all(|b| b.is_ascii_graphic()) {
        return " (stored with an unrecognised k8s:enc: prefix)".into();
    }
    format!(" (stored with {})", String::from_utf8_lossy(prefix))
}

/// One configured resource: where its keys live and how they are transformed.
struct Route {
    key_prefix: String,
    resource: String,
    chain: Arc<Chain>,
    ops: OpCounters,
}

/// `watchcache_transformation_operations_total` children, bound once per
/// resource so the per-value path touches plain atomics.
struct OpCounters {
    from_ok: IntCounter,
    from_err: IntCounter,
    to_ok: IntCounter,
    to_err: IntCounter,
}

impl OpCounters {
    fn new(resource: &str) -> OpCounters {
        let m = &crate::metrics::metrics().transformation_operations;
        OpCounters {
            from_ok: m.with_label_values(&[resource, "from_storage", "ok"]),
            from_err: m.with_label_values(&[resource, "from_storage", "error"]),
            to_ok: m.with_label_values(&[resource, "to_storage", "ok"]),
            to_err: m.with_label_values(&[resource, "to_storage", "error"]),
        }
    }
}

/// The store's transformer when `--encryption-provider-config` is set.
pub struct EncryptionTransformer {
    /// Longest key prefix first, so nested prefixes pick the closest resource.
    routes: Vec<Route>,
    /// Keys outside every configured resource: identity that refuses
    /// encrypted data (kube-apiserver's default for unmatched resources).
    fallback: Route,
}

impl std::fmt::Debug for EncryptionTransformer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncryptionTransformer")
            .field(
                "resources",
                &self
                    .routes
                    .iter()
                    .map(|r| (&r.resource, r.chain.providers.len()))
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl EncryptionTransformer {
    /// Reads and validates the file; `resources` and `etcd_prefix` give the
    /// key prefix of each resource it may apply to.
    pub fn load(
        path: &Path,
        resources: &[ResourceConfig],
        etcd_prefix: &str,
    ) -> Result<EncryptionTransformer, EncryptionConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| EncryptionConfigError::Read {
            file: file.clone(),
            source,
        })?;
        Self::parse(&text, &file, resources, etcd_prefix)
    }

    /// No `EncryptionConfiguration`: every resource is stored as is
    /// (identity, kube-apiserver's default), and its transformations are
    /// counted like configured ones, so the metrics exist either way.
    pub fn identity(resources: &[ResourceConfig], etcd_prefix: &str) -> EncryptionTransformer {
        let mut routes: Vec<Route> = resources
            .iter()
            .map(|r| {
                let resource = group_resource(&r.group, &r.plural);
                Route {
                    key_prefix: r.key_prefix(etcd_prefix),
                    ops: OpCounters::new(&resource),
                    resource,
                    chain: Arc::new(Chain::identity()),
                }
            })
            .collect();
        routes.sort_by_key(|r| std::cmp::Reverse(r.key_prefix.len()));
        EncryptionTransformer {
            routes,
            fallback: Route {
                key_prefix: String::new(),
                resource: "unknown".into(),
                chain: Arc::new(Chain::identity()),
                ops: OpCounters::new("unknown"),
            },
        }
    }

    /// Parses config text (YAML or JSON); `file` names the source in errors.
    pub fn parse(
        text: &str,
        file: &str,
        resources: &[ResourceConfig],
        etcd_prefix: &str,
    ) -> Result<EncryptionTransformer, EncryptionConfigError> {
        // No source snippet in errors: the lines around a mistake may hold keys.
        let options = serde_saphyr::options! { with_snippet: false };
        let cfg: EncryptionConfiguration = serde_saphyr::from_str_with_options(text, options)
            .map_err(|e| EncryptionConfigError::Parse {
                file: file.to_string(),
                message: e.to_string(),
            })?;
        let rules = build_rules(&cfg, file)?;
        let routes = resources
            .iter()
            .map(|r| {
                let resource = group_resource(&r.group, &r.plural);
                let chain = rules.lookup(&r.group, &r.plural);
                Route {
                    key_prefix: r.key_prefix(etcd_prefix),
                    ops: OpCounters::new(&resource),
                    resource,
                    chain,
                }
            })
            .collect::<Vec<_>>();
        let mut routes = routes;
        routes.sort_by_key(|r| std::cmp::Reverse(r.key_prefix.len()));
        Ok(EncryptionTransformer {
            routes,
            fallback: Route {
                key_prefix: String::new(),
                resource: "unknown".into(),
                chain: Arc::new(Chain::identity()),
                ops: OpCounters::new("unknown"),
            },
        })
    }

    fn route(&self, key: &str) -> &Route {
        self.routes
            .iter()
            .find(|r| key.starts_with(&r.key_prefix))
            .unwrap_or(&self.fallback)
    }
}

impl Transformer for EncryptionTransformer {
    fn to_storage(&self, key: &str, value: Bytes) -> Result<Bytes, StorageError> {
        let route = self.route(key);
        match route.chain.encrypt(key, &value) {
            Ok(v) => {
                route.ops.to_ok.inc();
                Ok(v)
            }
            Err(error) => {
                route.ops.to_err.inc();
                Err(failed(route, key, error))
            }
        }
    }

    fn from_storage(&self, key: &str, value: Bytes) -> Result<Bytes, StorageError> {
        self.from_storage_checked(key, value).map(|(v, _)| v)
    }

    fn from_storage_checked(&self, key: &str, value: Bytes) -> Result<(Bytes, bool), StorageError> {
        let route = self.route(key);
        match route.chain.decrypt(key, &value) {
            Ok(v) => {
                route.ops.from_ok.inc();
                Ok(v)
            }
            Err(error) => {
                route.ops.from_err.inc();
                Err(failed(route, key, error))
            }
        }
    }
}

/// Counts a failure by reason and wraps it for the store. Logging is the
/// caller's: the reflector logs a skipped key once, a request returns it.
fn failed(route: &Route, key: &str, error: TransformError) -> StorageError {
    crate::metrics::metrics()
        .transformation_failures
        .with_label_values(&[&route.resource, error.reason()])
        .inc();
    StorageError::Transformation {
        key: key.to_string(),
        error,
    }
}

/// `plural` or `plural.group`, as Kubernetes prints a GroupResource.
fn group_resource(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

// ---- resource rules ----------------------------------------------------------

/// Provider chains by (group, resource); `*` is the wildcard.
struct Rules {
    by_resource: HashMap<(String, String), Vec<Arc<Provider>>>,
}

impl Rules {
    /// Exact resource, then `*.group`, then `*.*`, else identity: the lookup
    /// order of kube-apiserver's transformerFromOverrides.
    fn lookup(&self, group: &str, plural: &str) -> Arc<Chain> {
        for k in [
            (group.to_string(), plural.to_string()),
            (group.to_string(), "*".to_string()),
            ("*".to_string(), "*".to_string()),
        ] {
            if let Some(p) = self.by_resource.get(&k) {
                return Arc::new(Chain {
                    providers: p.clone(),
                });
            }
        }
        Arc::new(Chain::identity())
    }
}

fn build_rules(cfg: &EncryptionConfiguration, file: &str) -> Result<Rules, EncryptionConfigError> {
    let invalid = |field: String, message: String| EncryptionConfigError::Invalid {
        file: file.to_string(),
        field,
        message,
    };
    if cfg.api_version != "apiserver.config.k8s.io/v1" {
        return Err(invalid(
            "apiVersion".into(),
            format!("want apiserver.config.k8s.io/v1, got {:?}", cfg.api_version),
        ));
    }
    if cfg.kind != "EncryptionConfiguration" {
        return Err(invalid(
            "kind".into(),
            format!("want EncryptionConfiguration, got {:?}", cfg.kind),
        ));
    }
    if cfg.resources.is_empty() {
        return Err(invalid(
            "resources".into(),
            "at least one resources entry is required".into(),
        ));
    }
    let mut by_resource: HashMap<(String, String), Vec<Arc<Provider>>> = HashMap::new();
    for (i, entry) in cfg.resources.iter().enumerate() {
        if entry.resources.is_empty() {
            return Err(invalid(
                format!("resources[{i}].resources"),
                "at least one resource is required".into(),
            ));
        }
        if entry.providers.is_empty() {
            return Err(invalid(
                format!("resources[{i}].providers"),
                "at least one provider is required".into(),
            ));
        }
        let mut chain = Vec::new();
        for (j, p) in entry.providers.iter().enumerate() {
            let at = format!("resources[{i}].providers[{j}]");
            chain.extend(build_provider(p, &at).map_err(|(f, m)| invalid(f, m))?);
        }
        for (j, r) in entry.resources.iter().enumerate() {
            let at = format!("resources[{i}].resources[{j}]");
            let (group, resource) = parse_resource(r).map_err(|m| invalid(at.clone(), m))?;
            // An earlier wildcard masks a later rule: kube-apiserver refuses that.
            for mask in [(group.clone(), "*".to_string()), ("*".into(), "*".into())] {
                if mask != (group.clone(), resource.clone()) && by_resource.contains_key(&mask) {
                    return Err(invalid(
                        at,
                        format!(
                            "resource {r:?} is masked by an earlier rule {:?}",
                            group_resource_yaml(&mask.0, &mask.1)
                        ),
                    ));
                }
            }
            by_resource
                .entry((group, resource))
                .or_default()
                .extend(chain.iter().cloned());
        }
    }
    Ok(Rules { by_resource })
}

/// `*.apps` style spelling of (group, resource) for messages.
fn group_resource_yaml(group: &str, resource: &str) -> String {
    format!("{resource}.{group}")
}

/// `secrets` -> ("", "secrets"); `deployments.apps` -> ("apps", "deployments");
/// `*.` -> ("", "*"); `*.apps` -> ("apps", "*"); `*.*` -> ("*", "*").
fn parse_resource(r: &str) -> Result<(String, String), String> {
    if r.is_empty() {
        return Err("resource name must not be empty".into());
    }
    if r != r.to_ascii_lowercase() {
        return Err(format!("resource name {r:?} must be lower case"));
    }
    if r == "*" {
        return Err("use '*.' to match all resources in the core group, or '*.*' for all".into());
    }
    let (resource, group) = r.split_once('.').unwrap_or((r, ""));
    if resource.is_empty() {
        return Err(format!("invalid resource {r:?}"));
    }
    if group == "*" && resource != "*" {
        return Err(format!(
            "{r:?}: a resource in any group is not supported; use '*.*'"
        ));
    }
    Ok((group.to_string(), resource.to_string()))
}

/// One `providers[j]` entry -> its providers (one per key).
fn build_provider(p: &ProviderEntry, at: &str) -> Result<Vec<Arc<Provider>>, (String, String)> {
    let set = [
        p.aesgcm.is_some(),
        p.aescbc.is_some(),
        p.secretbox.is_some(),
        p.identity.is_some(),
        p.kms.is_some(),
    ]
    .iter()
    .filter(|x| **x)
    .count();
    if set == 0 {
        return Err((
            at.to_string(),
            "provider does not contain any of the expected providers: aesgcm, aescbc, secretbox, identity".into(),
        ));
    }
    if set > 1 {
        return Err((
            at.to_string(),
            "more than one provider specified in a single element, should split into different list elements".into(),
        ));
    }
    if p.kms.is_some() {
        return Err((
            format!("{at}.kms"),
            "KMS providers are not supported by watchcache (aesgcm, aescbc, secretbox, identity are)".into(),
        ));
    }
    if p.identity.is_some() {
        return Ok(vec![Arc::new(Provider {
            prefix: Vec::new(),
            name: "identity".into(),
            cipher: None,
        })]);
    }
    let (kind, keys, sizes): (&str, &KeysConfig, &[usize]) = if let Some(k) = &p.aesgcm {
        ("aesgcm", k, &[16, 24, 32])
    } else if let Some(k) = &p.aescbc {
        ("aescbc", k, &[16, 24, 32])
    } else if let Some(k) = &p.secretbox {
        ("secretbox", k, &[32])
    } else {
        return Err((at.to_string(), "no provider".into()));
    };
    let at = format!("{at}.{kind}.keys");
    if keys.keys.is_empty() {
        return Err((at, "at least one key is required".into()));
    }
    let mut out = Vec::with_capacity(keys.keys.len());
    for (k, key) in keys.keys.iter().enumerate() {
        let at = format!("{at}[{k}]");
        // kube-apiserver's only rule for a key name (validateKey): any
        // other name, `:`, spaces and duplicates included, is valid there,
        // and a config it accepts must start (and read its data) here too.
        // Reads cope with prefixes that overlap: every match is tried.
        if key.name.is_empty() {
            return Err((
                format!("{at}.name"),
                "name is a mandatory field for a key".into(),
            ));
        }
        if key.secret.is_empty() {
            return Err((
                format!("{at}.secret"),
                "secret is a mandatory field for a key".into(),
            ));
        }
        // Never echo the secret.
        let secret = base64::engine::general_purpose::STANDARD
            .decode(key.secret.trim())
            .map_err(|_| {
                (
                    format!("{at}.secret"),
                    "secrets must be base64 encoded".into(),
                )
            })?;
        if !sizes.contains(&secret.len()) {
            return Err((
                format!("{at}.secret"),
                format!(
                    "secret is not of the expected length, got {}, expected one of {sizes:?}",
                    secret.len()
                ),
            ));
        }
        let cipher = Cipher::new(kind, &secret)
            .ok_or_else(|| (format!("{at}.secret"), "unusable key".to_string()))?;
        out.push(Arc::new(Provider {
            prefix: format!("k8s:enc:{kind}:v1:{}:", key.name).into_bytes(),
            name: format!("{kind} key {}", key.name),
            cipher: Some(cipher),
        }));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
