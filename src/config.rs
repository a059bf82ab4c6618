//! TOML configuration (docs/DESIGN.md section 6).
//!
//! Loading is two steps: serde parses the file (unknown fields are errors, so a
//! typo never silently falls back to a default), then [`Config::validate`]
//! checks the values. Every error names the file and the field.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::object::validation::{is_dns1123_label, is_dns1123_subdomain};

/// Default request body limit (Kubernetes uses 3 MiB).
pub const DEFAULT_MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
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

impl ServerConfig {
    /// Applies kube-apiserver's `--feature-gates=Name=bool,...` for the
    /// gates watchcache has: `APIResponseCompression`,
    /// `ShardedListAndWatch`. Errors read as kube-apiserver's.
    pub fn set_feature_gates(&mut self, spec: &str) -> Result<(), String> {
        for pair in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((name, value)) = pair.split_once('=') else {
                return Err(format!("missing bool value for {pair}"));
            };
            let (name, value) = (name.trim(), value.trim());
            let on = match value {
                "1" | "t" | "T" | "true" | "TRUE" | "True" => true,
                "0" | "f" | "F" | "false" | "FALSE" | "False" => false,
                _ => {
                    return Err(format!(
                        "invalid value of {name}={value}, err: strconv.ParseBool: parsing {value:?}: invalid syntax"
                    ));
                }
            };
            match name {
                "APIResponseCompression" => self.response_compression = on,
                "ShardedListAndWatch" => self.sharded_list_and_watch = on,
                _ => return Err(format!("unrecognized feature gate: {name}")),
            }
        }
        Ok(())
    }
}

impl ConfigError {
    fn invalid(file: &str, field: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Invalid {
            file: file.to_string(),
            field: field.into(),
            message: message.into(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Address the HTTP API listens on.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Address of the etcd v3 gRPC front (`--grpc-listen`); off when unset.
    #[serde(default)]
    pub grpc_listen: Option<String>,
    /// Largest request message the gRPC front accepts: etcd's own limit
    /// (`--max-request-bytes`, 1.5 MiB by default, plus its 512 KiB of gRPC
    /// overhead). Raise it with etcd's. A larger request could never
    /// succeed, and its buffer is reserved as soon as its length is read.
    #[serde(default = "default_grpc_max_request_bytes")]
    pub grpc_max_request_bytes: usize,
    /// etcd key prefixes the gRPC front caches besides the resources'
    /// (taken as written, not under `etcd.prefix`), without serving them
    /// over REST: what other etcd clients of the front watch (e.g.
    /// kube-apiserver's `compact_rev_key` and resources this file does not
    /// serve), so their watches share the front's one etcd watch per prefix
    /// instead of each going to etcd.
    #[serde(default)]
    pub grpc_cache_prefixes: Vec<String>,
    #[serde(default)]
    pub etcd: EtcdConfig,
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub resources: Vec<ResourceConfig>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EtcdConfig {
    #[serde(default = "default_endpoints")]
    pub endpoints: Vec<String>,
    /// Key prefix: key = {prefix}/{plural}/{ns}/{name}; non-core: {prefix}/{group}/{plural}/...
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// Deadline for every etcd request, in milliseconds.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// Deadline for establishing a connection, in milliseconds.
    #[serde(default = "default_dial_timeout_ms")]
    pub dial_timeout_ms: u64,
    /// Bounded retries of a GuaranteedUpdate on CAS conflict.
    #[serde(default = "default_max_update_retries")]
    pub max_update_retries: u32,
    /// Window within which writes with a TTL reuse one lease.
    #[serde(default = "default_lease_reuse_seconds")]
    pub lease_reuse_seconds: u64,
    /// Page size of the reflector's initial list.
    #[serde(default = "default_list_page_size")]
    pub list_page_size: i64,
    /// TLS / mutual TLS for `https://` endpoints (`[etcd.tls]`).
    #[serde(default)]
    pub tls: Option<EtcdTlsConfig>,
    /// kube-apiserver's `EncryptionConfiguration` file (YAML or JSON):
    /// encryption at rest, as `--encryption-provider-config`.
    #[serde(default)]
    pub encryption_provider_config: Option<PathBuf>,
    /// etcd user (etcd's own auth, `etcdctl --user`): the daemon's identity
    /// when etcd has auth enabled and no client certificate names it.
    #[serde(default)]
    pub username: Option<String>,
    /// Password of `username`.
    #[serde(default)]
    pub password: Option<Password>,
}

/// A password: kept out of `Debug` output (configs are logged).
#[derive(Clone, Serialize, Deserialize, PartialEq)]
#[serde(transparent)]
pub struct Password(pub String);

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// `[etcd.tls]`: the files of etcd's client `TransportConfig`, named like
/// kube-apiserver's `--etcd-cafile`, `--etcd-certfile`, `--etcd-keyfile`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EtcdTlsConfig {
    /// PEM bundle of the CA(s) that sign etcd's serving certificate.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (chain) for etcd's `--client-cert-auth`.
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// Name to verify etcd's certificate against, instead of the endpoint host.
    #[serde(default)]
    pub server_name: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Request bodies larger than this get 413.
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: usize,
    /// Concurrent watches beyond this get 429.
    #[serde(default = "default_max_watches")]
    pub max_watches: usize,
    /// Slow clients that do not finish their headers in this time are
    /// dropped (Go's `ReadHeaderTimeout`). A new connection gets this long,
    /// from accept, to deliver its first request: the first bytes, the
    /// HTTP/2 preface and the first request's headers.
    #[serde(default = "default_header_read_timeout_ms")]
    pub header_read_timeout_ms: u64,
    /// A request body must arrive whole within this time, or the request
    /// gets 408 (and an HTTP/1.1 connection is closed): a client that sends
    /// a `Content-Length` and then nothing holds no connection and task
    /// for ever. kube-apiserver bounds a whole request by its 60 s
    /// `--request-timeout`.
    #[serde(default = "default_request_body_timeout_ms")]
    pub request_body_timeout_ms: u64,
    /// A connection with no request in flight for this long is closed
    /// (Go's `IdleTimeout`; kube-apiserver uses 90 s). 0 = never.
    #[serde(default = "default_idle_timeout_ms")]
    pub idle_timeout_ms: u64,
    /// Open connections beyond this are closed at accept (and counted in
    /// `watchcache_api_connections_refused_total`). Keep it below the
    /// process's file-descriptor limit (`ulimit -n`).
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// A watch whose client leaves more than this many bytes unread (beyond
    /// what the connection's buffers hold) is cut off; the client sees the
    /// stream end and resumes from its last resourceVersion. Initial events
    /// are exempt: they wait for the client instead.
    #[serde(default = "default_watch_max_buffered_bytes")]
    pub watch_max_buffered_bytes: usize,
    /// Bytes of finished List bodies kept, in all resources, so a List of
    /// the same snapshot (an informer relist storm, a controller listing a
    /// quiet resource again) is written from them instead of being built
    /// again (`api::list_body_cache`). 0 turns it off.
    #[serde(default = "default_list_body_cache_bytes")]
    pub list_body_cache_bytes: usize,
    /// Gzip responses over 128 KiB (not watches) for clients that send
    /// `Accept-Encoding: gzip`, as kube-apiserver's
    /// `APIResponseCompression` feature gate (on by default there too;
    /// `api::compression`).
    #[serde(default = "default_true")]
    pub response_compression: bool,
    /// Serve `shardSelector` on List and Watch, as kube-apiserver 1.36+'s
    /// alpha `ShardedListAndWatch` feature gate (off by default there too:
    /// the parameter is then ignored; `object::sharding`).
    #[serde(default)]
    pub sharded_list_and_watch: bool,
    /// Coalesce a connection's small writes (HTTP/2 frames, HTTP/1.1
    /// chunks) into one system call per batch instead of one per frame:
    /// the largest saving in watch fan-out. Off only to measure it.
    #[serde(default = "default_true")]
    pub coalesce_writes: bool,
    /// Bound of the consistent-read wait before falling back to etcd.
    #[serde(default = "default_consistent_read_timeout_ms")]
    pub consistent_read_timeout_ms: u64,
    /// Interval of periodic watch bookmarks.
    #[serde(default = "default_bookmark_interval_ms")]
    pub bookmark_interval_ms: u64,
    /// Watches without `timeoutSeconds` end after a random time in
    /// `[min, 2*min)` seconds, like kube-apiserver's `--min-request-timeout`.
    #[serde(default = "default_min_request_timeout_seconds")]
    pub min_request_timeout_seconds: u64,
    /// Serving TLS; plain HTTP without it.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    #[serde(default)]
    pub authentication: AuthenticationConfig,
    #[serde(default)]
    pub authorization: AuthorizationConfig,
    /// Every this many seconds each resource's cache is compared with etcd
    /// at one revision (and relisted on a mismatch); 0 turns it off.
    #[serde(default = "default_consistency_check_interval_seconds")]
    pub consistency_check_interval_seconds: u64,
    /// gRPC front: how often an idle `progress_notify` watch gets a progress
    /// notification (etcd's `--experimental-watch-progress-notify-interval`).
    #[serde(default = "default_watch_progress_notify_interval_ms")]
    pub watch_progress_notify_interval_ms: u64,
}

/// `[server.tls]` (kube-apiserver's `--tls-cert-file`,
/// `--tls-private-key-file`, `--tls-min-version`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain, serving certificate first. Re-read on change.
    pub cert_file: PathBuf,
    /// PEM private key of the certificate.
    pub private_key_file: PathBuf,
    /// `VersionTLS12` (default) or `VersionTLS13`.
    #[serde(default = "default_tls_min_version")]
    pub min_version: String,
}

/// `[server.authentication]`: the authenticators, tried in kube-apiserver's
/// order (client certificate, bearer token, anonymous).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AuthenticationConfig {
    /// `--client-ca-file`: PEM CA bundle for client certificates (needs TLS).
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
    /// `--token-auth-file`: CSV `token,user,uid,"group1,group2"`.
    #[serde(default)]
    pub token_auth_file: Option<PathBuf>,
    /// `--anonymous-auth`: requests without credentials are
    /// `system:anonymous`. Default: true only when no authenticator is set.
    #[serde(default)]
    pub anonymous: Option<bool>,
}

impl AuthenticationConfig {
    /// Whether requests without credentials are let in as anonymous.
    pub fn anonymous_enabled(&self) -> bool {
        self.anonymous
            .unwrap_or(self.client_ca_file.is_none() && self.token_auth_file.is_none())
    }
}

/// `--authorization-mode`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub enum AuthorizationMode {
    #[default]
    AlwaysAllow,
    #[serde(rename = "RBAC")]
    Rbac,
}

impl AuthorizationMode {
    pub fn parse(s: &str) -> Result<AuthorizationMode, String> {
        match s {
            "AlwaysAllow" => Ok(AuthorizationMode::AlwaysAllow),
            "RBAC" => Ok(AuthorizationMode::Rbac),
            _ => Err(format!(
                "unsupported authorization mode {s:?}: want AlwaysAllow or RBAC"
            )),
        }
    }
}

/// `[server.authorization]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AuthorizationConfig {
    #[serde(default)]
    pub mode: AuthorizationMode,
    /// `--rbac-policy-file`: YAML files of Roles, ClusterRoles and bindings.
    #[serde(default)]
    pub policy_files: Vec<PathBuf>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ResourceConfig {
    #[serde(default)]
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    #[serde(default)]
    pub namespaced: bool,
    /// Field paths usable in fieldSelector and watch routing.
    #[serde(default)]
    pub indexes: Vec<String>,
    /// A fixed history of this many events. Unset: the history is sized as
    /// kube-apiserver sizes its watch cache, by the `history_min_*` and
    /// `history_max_*` settings (docs/DESIGN.md section 4, "History").
    #[serde(default)]
    pub history_capacity: Option<usize>,
    /// Keep at least this many seconds of events (kube-apiserver: 75).
    #[serde(default = "default_history_min_seconds")]
    pub history_min_seconds: u64,
    /// The history's capacity never goes below this (kube-apiserver: 100) ...
    #[serde(default = "default_history_min_events")]
    pub history_min_events: usize,
    /// ... nor above this (kube-apiserver: 102,400).
    #[serde(default = "default_history_max_events")]
    pub history_max_events: usize,
    /// The history's events never take more than this many wire bytes,
    /// whatever the other settings say.
    #[serde(default = "default_history_max_bytes")]
    pub history_max_bytes: u64,
    /// Optional override of the etcd key prefix for this resource.
    #[serde(default)]
    pub key_prefix: Option<String>,
    /// Optional TTL: writes attach a (reused) lease.
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
    /// How writes store objects: `json` (default) or `protobuf`, kube-apiserver's
    /// encoding of built-in types. Reads detect the encoding of each value.
    #[serde(default)]
    pub storage_encoding: StorageEncoding,
    /// Discovery's `shortNames` (`kubectl get po`); unset: Kubernetes' own
    /// for a built-in resource ([`BUILT_IN_DISCOVERY`]), none otherwise.
    #[serde(default)]
    pub short_names: Option<Vec<String>>,
    /// Discovery's `categories` (`kubectl get all`); unset: as `short_names`.
    #[serde(default)]
    pub categories: Option<Vec<String>>,
}

/// An empty resource with every setting at its default (the fields a file
/// must give are empty): a base for resources made in code.
impl Default for ResourceConfig {
    fn default() -> Self {
        ResourceConfig {
            group: String::new(),
            version: String::new(),
            kind: String::new(),
            plural: String::new(),
            namespaced: false,
            indexes: Vec::new(),
            history_capacity: None,
            history_min_seconds: default_history_min_seconds(),
            history_min_events: default_history_min_events(),
            history_max_events: default_history_max_events(),
            history_max_bytes: default_history_max_bytes(),
            key_prefix: None,
            ttl_seconds: None,
            storage_encoding: StorageEncoding::default(),
            short_names: None,
            categories: None,
        }
    }
}

/// Kubernetes' short names and categories of built-in resources, by
/// (group, plural), as kube-apiserver's discovery lists them: kubectl
/// resolves `po`, `svc`, `deploy` and `all` only through discovery.
const BUILT_IN_DISCOVERY: &[(&str, &str, &[&str], &[&str])] = &[
    ("", "pods", &["po"], &["all"]),
    ("", "services", &["svc"], &["all"]),
    ("", "replicationcontrollers", &["rc"], &["all"]),
    ("", "nodes", &["no"], &[]),
    ("", "namespaces", &["ns"], &[]),
    ("", "configmaps", &["cm"], &[]),
    ("", "endpoints", &["ep"], &[]),
    ("", "events", &["ev"], &[]),
    ("", "limitranges", &["limits"], &[]),
    ("", "persistentvolumes", &["pv"], &[]),
    ("", "persistentvolumeclaims", &["pvc"], &[]),
    ("", "resourcequotas", &["quota"], &[]),
    ("", "serviceaccounts", &["sa"], &[]),
    ("apps", "deployments", &["deploy"], &["all"]),
    ("apps", "replicasets", &["rs"], &["all"]),
    ("apps", "daemonsets", &["ds"], &["all"]),
    ("apps", "statefulsets", &["sts"], &["all"]),
    ("batch", "jobs", &[], &["all"]),
    ("batch", "cronjobs", &["cj"], &["all"]),
    (
        "autoscaling",
        "horizontalpodautoscalers",
        &["hpa"],
        &["all"],
    ),
    ("networking.k8s.io", "ingresses", &["ing"], &[]),
    ("networking.k8s.io", "networkpolicies", &["netpol"], &[]),
    ("policy", "poddisruptionbudgets", &["pdb"], &[]),
    ("storage.k8s.io", "storageclasses", &["sc"], &[]),
    ("scheduling.k8s.io", "priorityclasses", &["pc"], &[]),
    ("events.k8s.io", "events", &["ev"], &[]),
    (
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        &["crd", "crds"],
        &["api-extensions"],
    ),
    (
        "certificates.k8s.io",
        "certificatesigningrequests",
        &["csr"],
        &[],
    ),
    (
        "apiregistration.k8s.io",
        "apiservices",
        &[],
        &["api-extensions"],
    ),
    (
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations",
        &[],
        &["api-extensions"],
    ),
    (
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations",
        &[],
        &["api-extensions"],
    ),
    (
        "admissionregistration.k8s.io",
        "validatingadmissionpolicies",
        &[],
        &["api-extensions"],
    ),
    (
        "admissionregistration.k8s.io",
        "validatingadmissionpolicybindings",
        &[],
        &["api-extensions"],
    ),
    (
        "admissionregistration.k8s.io",
        "mutatingadmissionpolicies",
        &[],
        &["api-extensions"],
    ),
    (
        "admissionregistration.k8s.io",
        "mutatingadmissionpolicybindings",
        &[],
        &["api-extensions"],
    ),
];

/// The encoding of stored values (kube-apiserver's `--storage-media-type`:
/// `application/json` or `application/vnd.kubernetes.protobuf`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StorageEncoding {
    #[default]
    Json,
    /// `k8s\0` + `runtime.Unknown`; only for built-in Kubernetes types.
    Protobuf,
}

fn default_grpc_max_request_bytes() -> usize {
    (3 << 19) + (512 << 10)
}
fn default_listen() -> String {
    "127.0.0.1:8080".into()
}
fn default_endpoints() -> Vec<String> {
    vec!["http://127.0.0.1:2379".into()]
}
fn default_prefix() -> String {
    "/registry".into()
}
fn default_request_timeout_ms() -> u64 {
    5_000
}
fn default_dial_timeout_ms() -> u64 {
    3_000
}
fn default_max_update_retries() -> u32 {
    100
}
fn default_lease_reuse_seconds() -> u64 {
    60
}
fn default_list_page_size() -> i64 {
    10_000
}
fn default_max_body_bytes() -> usize {
    DEFAULT_MAX_BODY_BYTES
}
fn default_max_watches() -> usize {
    100_000
}
fn default_request_body_timeout_ms() -> u64 {
    60_000
}
fn default_header_read_timeout_ms() -> u64 {
    10_000
}
fn default_idle_timeout_ms() -> u64 {
    90_000
}
fn default_max_connections() -> usize {
    10_000
}
fn default_true() -> bool {
    true
}

fn default_watch_max_buffered_bytes() -> usize {
    256 * 1024
}
fn default_list_body_cache_bytes() -> usize {
    256 << 20
}

fn default_consistent_read_timeout_ms() -> u64 {
    3_000
}
fn default_bookmark_interval_ms() -> u64 {
    60_000
}
fn default_min_request_timeout_seconds() -> u64 {
    1800
}
fn default_tls_min_version() -> String {
    "VersionTLS12".into()
}
fn default_consistency_check_interval_seconds() -> u64 {
    300
}
fn default_watch_progress_notify_interval_ms() -> u64 {
    600_000
}
fn default_history_min_seconds() -> u64 {
    75
}
fn default_history_min_events() -> usize {
    100
}
fn default_history_max_events() -> usize {
    100 * 1024
}
fn default_history_max_bytes() -> u64 {
    256 << 20
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: default_endpoints(),
            prefix: default_prefix(),
            request_timeout_ms: default_request_timeout_ms(),
            dial_timeout_ms: default_dial_timeout_ms(),
            max_update_retries: default_max_update_retries(),
            lease_reuse_seconds: default_lease_reuse_seconds(),
            list_page_size: default_list_page_size(),
            tls: None,
            encryption_provider_config: None,
            username: None,
            password: None,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_body_bytes: default_max_body_bytes(),
            max_watches: default_max_watches(),
            header_read_timeout_ms: default_header_read_timeout_ms(),
            request_body_timeout_ms: default_request_body_timeout_ms(),
            idle_timeout_ms: default_idle_timeout_ms(),
            max_connections: default_max_connections(),
            watch_max_buffered_bytes: default_watch_max_buffered_bytes(),
            list_body_cache_bytes: default_list_body_cache_bytes(),
            response_compression: true,
            sharded_list_and_watch: false,
            coalesce_writes: true,
            consistent_read_timeout_ms: default_consistent_read_timeout_ms(),
            bookmark_interval_ms: default_bookmark_interval_ms(),
            min_request_timeout_seconds: default_min_request_timeout_seconds(),
            tls: None,
            authentication: AuthenticationConfig::default(),
            authorization: AuthorizationConfig::default(),
            consistency_check_interval_seconds: default_consistency_check_interval_seconds(),
            watch_progress_notify_interval_ms: default_watch_progress_notify_interval_ms(),
        }
    }
}

impl EtcdConfig {
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }
    pub fn dial_timeout(&self) -> Duration {
        Duration::from_millis(self.dial_timeout_ms)
    }
}

impl ResourceConfig {
    /// Discovery's `shortNames`: configured, or Kubernetes' own.
    pub fn short_names(&self) -> Vec<&str> {
        match &self.short_names {
            Some(n) => n.iter().map(String::as_str).collect(),
            None => self.built_in().map(|b| b.2.to_vec()).unwrap_or_default(),
        }
    }

    /// Discovery's `categories`: configured, or Kubernetes' own.
    pub fn categories(&self) -> Vec<&str> {
        match &self.categories {
            Some(c) => c.iter().map(String::as_str).collect(),
            None => self.built_in().map(|b| b.3.to_vec()).unwrap_or_default(),
        }
    }

    fn built_in(
        &self,
    ) -> Option<&'static (
        &'static str,
        &'static str,
        &'static [&'static str],
        &'static [&'static str],
    )> {
        BUILT_IN_DISCOVERY
            .iter()
            .find(|(g, p, _, _)| *g == self.group && *p == self.plural)
    }

    /// `apiVersion` as written in objects: `v1` for core, `group/version` otherwise.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Base path of the REST API: `/api/v1` for core, `/apis/{group}/{version}` otherwise.
    pub fn base_path(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }

    /// The etcd key prefix of this resource, always ending in `/`.
    /// The object codec of this resource; `etcd_prefix` is `EtcdConfig::prefix`.
    pub fn object_codec(&self, etcd_prefix: &str) -> crate::object::ObjectCodec {
        crate::object::ObjectCodec::new(
            self.key_prefix(etcd_prefix),
            self.namespaced,
            &self.indexes,
            &self.api_version(),
            &self.kind,
        )
    }

    pub fn key_prefix(&self, etcd_prefix: &str) -> String {
        let mut p = match &self.key_prefix {
            Some(p) => p.clone(),
            None => {
                let base = etcd_prefix.trim_end_matches('/');
                if self.group.is_empty() {
                    format!("{base}/{}", self.plural)
                } else {
                    format!("{base}/{}/{}", self.group, self.plural)
                }
            }
        };
        if !p.ends_with('/') {
            p.push('/');
        }
        p
    }
}

impl Config {
    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let cfg = Config::read(path)?;
        cfg.validate(&path.display().to_string())?;
        Ok(cfg)
    }

    /// Reads and parses a config file without validating it: for a caller
    /// that completes it first (the daemon's command-line flags, such as
    /// `--etcd-cafile` for `https://` endpoints) and then calls
    /// [`Config::validate`] once on the result.
    pub fn read(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: file.clone(),
            source,
        })?;
        Config::parse_unvalidated(&text, &file)
    }

    /// Parses and validates config text; `file` names the source in errors.
    pub fn parse(text: &str, file: &str) -> Result<Config, ConfigError> {
        let cfg = Config::parse_unvalidated(text, file)?;
        cfg.validate(file)?;
        Ok(cfg)
    }

    fn parse_unvalidated(text: &str, file: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            file: file.to_string(),
            message: parse_message(&e, text),
        })
    }

    /// The example configuration shipped in `config/watchcache.toml` (used by dev mode).
    pub fn example() -> Config {
        // The file is part of the crate, so parsing it cannot fail at run time
        // unless the source tree itself is broken; a unit test guards that.
        Config::parse(EXAMPLE_CONFIG, "config/watchcache.toml")
            .unwrap_or_else(|e| panic!("shipped example config is invalid: {e}"))
    }

    pub fn validate(&self, file: &str) -> Result<(), ConfigError> {
        self.listen_addr()
            .map_err(|m| ConfigError::invalid(file, "listen", m))?;
        self.grpc_listen_addr()
            .map_err(|m| ConfigError::invalid(file, "grpc_listen", m))?;
        if self.grpc_max_request_bytes == 0 {
            return Err(ConfigError::invalid(
                file,
                "grpc_max_request_bytes",
                "must be greater than 0",
            ));
        }
        for (i, p) in self.grpc_cache_prefixes.iter().enumerate() {
            if p.is_empty() {
                return Err(ConfigError::invalid(
                    file,
                    format!("grpc_cache_prefixes[{i}]"),
                    "must not be empty (a prefix of every key is no cache)",
                ));
            }
        }
        if self.etcd.endpoints.is_empty() {
            return Err(ConfigError::invalid(
                file,
                "etcd.endpoints",
                "at least one endpoint is required",
            ));
        }
        for (i, ep) in self.etcd.endpoints.iter().enumerate() {
            validate_endpoint(ep)
                .map_err(|m| ConfigError::invalid(file, format!("etcd.endpoints[{i}]"), m))?;
        }
        self.validate_tls(file)?;
        if self.etcd.username.is_some() != self.etcd.password.is_some() {
            return Err(ConfigError::invalid(
                file,
                "etcd.username",
                "etcd.username and etcd.password go together",
            ));
        }
        if !self.etcd.prefix.starts_with('/') {
            return Err(ConfigError::invalid(
                file,
                "etcd.prefix",
                format!("must start with '/', got {:?}", self.etcd.prefix),
            ));
        }
        // Durations feed `Instant + Duration`, which panics on overflow: bound
        // them all. Zero is allowed only where it has a meaning.
        for (field, ms, zero_ok) in [
            (
                "etcd.request_timeout_ms",
                self.etcd.request_timeout_ms,
                false,
            ),
            ("etcd.dial_timeout_ms", self.etcd.dial_timeout_ms, false),
            (
                "server.header_read_timeout_ms",
                self.server.header_read_timeout_ms,
                true,
            ),
            (
                "server.request_body_timeout_ms",
                self.server.request_body_timeout_ms,
                false,
            ),
            (
                "server.consistent_read_timeout_ms",
                self.server.consistent_read_timeout_ms,
                true,
            ),
            (
                "server.bookmark_interval_ms",
                self.server.bookmark_interval_ms,
                false,
            ),
            (
                "server.watch_progress_notify_interval_ms",
                self.server.watch_progress_notify_interval_ms,
                false,
            ),
        ] {
            validate_duration(ms, zero_ok, MAX_DURATION_MS)
                .map_err(|m| ConfigError::invalid(file, field, m))?;
        }
        validate_duration(self.etcd.lease_reuse_seconds, true, MAX_LEASE_TTL_SECONDS)
            .map_err(|m| ConfigError::invalid(file, "etcd.lease_reuse_seconds", m))?;
        if self.etcd.list_page_size <= 0 {
            return Err(ConfigError::invalid(
                file,
                "etcd.list_page_size",
                "must be greater than 0",
            ));
        }
        if self.server.max_body_bytes == 0 {
            return Err(ConfigError::invalid(
                file,
                "server.max_body_bytes",
                "must be greater than 0",
            ));
        }
        // Twice this is added to an Instant: bound it like the other durations.
        validate_duration(
            self.server.min_request_timeout_seconds,
            false,
            MAX_DURATION_MS / 1000,
        )
        .map_err(|m| ConfigError::invalid(file, "server.min_request_timeout_seconds", m))?;
        validate_duration(
            self.server.consistency_check_interval_seconds,
            true,
            MAX_DURATION_MS / 1000,
        )
        .map_err(|m| ConfigError::invalid(file, "server.consistency_check_interval_seconds", m))?;
        if self.server.max_watches == 0 {
            return Err(ConfigError::invalid(
                file,
                "server.max_watches",
                "must be greater than 0",
            ));
        }
        if self.server.max_connections == 0 {
            return Err(ConfigError::invalid(
                file,
                "server.max_connections",
                "must be greater than 0",
            ));
        }
        if self.server.watch_max_buffered_bytes == 0 {
            return Err(ConfigError::invalid(
                file,
                "server.watch_max_buffered_bytes",
                "must be greater than 0",
            ));
        }
        self.validate_security(file)?;
        if self.resources.is_empty() {
            return Err(ConfigError::invalid(
                file,
                "resources",
                "at least one [[resources]] entry is required",
            ));
        }
        let mut seen = HashSet::new();
        for (i, r) in self.resources.iter().enumerate() {
            let at = |f: &str| format!("resources[{i}].{f}");
            if let Some(why) = is_dns1123_label(&r.version).first() {
                return Err(ConfigError::invalid(
                    file,
                    at("version"),
                    format!("invalid version {:?}: {why}", r.version),
                ));
            }
            if !r.group.is_empty()
                && let Some(why) = is_dns1123_subdomain(&r.group).first()
            {
                return Err(ConfigError::invalid(
                    file,
                    at("group"),
                    format!("invalid group {:?}: {why}", r.group),
                ));
            }
            if r.kind.is_empty() || !r.kind.chars().all(|c| c.is_ascii_alphanumeric()) {
                return Err(ConfigError::invalid(
                    file,
                    at("kind"),
                    format!("invalid kind {:?}", r.kind),
                ));
            }
            if let Some(why) = is_dns1123_label(&r.plural).first() {
                return Err(ConfigError::invalid(
                    file,
                    at("plural"),
                    format!("invalid plural {:?}: {why}", r.plural),
                ));
            }
            if !seen.insert((r.group.clone(), r.plural.clone())) {
                return Err(ConfigError::invalid(
                    file,
                    at("plural"),
                    format!("duplicate resource {:?} in group {:?}", r.plural, r.group),
                ));
            }
            if r.history_capacity == Some(0) {
                return Err(ConfigError::invalid(
                    file,
                    at("history_capacity"),
                    "must be greater than 0",
                ));
            }
            if r.history_min_events == 0 {
                return Err(ConfigError::invalid(
                    file,
                    at("history_min_events"),
                    "must be greater than 0",
                ));
            }
            if r.history_max_events < r.history_min_events {
                return Err(ConfigError::invalid(
                    file,
                    at("history_max_events"),
                    "must not be less than history_min_events",
                ));
            }
            if r.history_max_bytes == 0 {
                return Err(ConfigError::invalid(
                    file,
                    at("history_max_bytes"),
                    "must be greater than 0",
                ));
            }
            for (j, path) in r.indexes.iter().enumerate() {
                validate_field_path(path).map_err(|m| {
                    ConfigError::invalid(file, format!("resources[{i}].indexes[{j}]"), m)
                })?;
            }
            if r.storage_encoding == StorageEncoding::Protobuf
                && !crate::object::protobuf::is_builtin_type(&r.api_version(), &r.kind)
            {
                return Err(ConfigError::invalid(
                    file,
                    at("storage_encoding"),
                    format!(
                        "\"protobuf\" is only for built-in Kubernetes types; {} {} is not one",
                        r.api_version(),
                        r.kind
                    ),
                ));
            }
            if let Some(p) = &r.key_prefix
                && !p.starts_with('/')
            {
                return Err(ConfigError::invalid(
                    file,
                    at("key_prefix"),
                    format!("must start with '/', got {p:?}"),
                ));
            }
            if let Some(ttl) = r.ttl_seconds {
                validate_duration(ttl, false, MAX_LEASE_TTL_SECONDS)
                    .map_err(|m| ConfigError::invalid(file, at("ttl_seconds"), m))?;
            }
        }
        Ok(())
    }

    /// `[server.tls]`, `[server.authentication]`, `[server.authorization]`:
    /// the combinations that make sense (the files are read at start).
    fn validate_security(&self, file: &str) -> Result<(), ConfigError> {
        let s = &self.server;
        if let Some(tls) = &s.tls {
            for (field, p) in [
                ("server.tls.cert_file", &tls.cert_file),
                ("server.tls.private_key_file", &tls.private_key_file),
            ] {
                if p.as_os_str().is_empty() {
                    return Err(ConfigError::invalid(file, field, "must not be empty"));
                }
            }
            crate::tls::MinVersion::parse(&tls.min_version)
                .map_err(|m| ConfigError::invalid(file, "server.tls.min_version", m))?;
        }
        if s.authentication.client_ca_file.is_some() && s.tls.is_none() {
            return Err(ConfigError::invalid(
                file,
                "server.authentication.client_ca_file",
                "client certificates need TLS: set server.tls (--tls-cert-file, --tls-private-key-file)",
            ));
        }
        if s.authorization.mode == AuthorizationMode::AlwaysAllow
            && !s.authorization.policy_files.is_empty()
        {
            return Err(ConfigError::invalid(
                file,
                "server.authorization.policy_files",
                "RBAC policy files need mode = \"RBAC\" (--authorization-mode RBAC)",
            ));
        }
        Ok(())
    }

    /// `https://` and `http://` endpoints do not mix; TLS settings need
    /// `https://` endpoints and vice versa (the files are checked at start-up).
    fn validate_tls(&self, file: &str) -> Result<(), ConfigError> {
        let https: Vec<bool> = self
            .etcd
            .endpoints
            .iter()
            .map(|e| e.starts_with("https://"))
            .collect();
        if let Some(i) = https.iter().position(|h| *h != https[0]) {
            return Err(ConfigError::invalid(
                file,
                format!("etcd.endpoints[{i}]"),
                "mixes http:// and https:// endpoints",
            ));
        }
        match (&self.etcd.tls, https[0]) {
            (Some(tls), false) if *tls != EtcdTlsConfig::default() => Err(ConfigError::invalid(
                file,
                "etcd.tls",
                "TLS files are set but the endpoints are http://; use https:// endpoints",
            )),
            (None, true) => Err(ConfigError::invalid(
                file,
                "etcd.tls.ca_file",
                "https:// endpoints need [etcd.tls] ca_file (--etcd-cafile)",
            )),
            _ => Ok(()),
        }
    }

    /// The gRPC front's address, `None` when the front is off.
    pub fn grpc_listen_addr(&self) -> Result<Option<SocketAddr>, String> {
        match &self.grpc_listen {
            None => Ok(None),
            Some(a) => a
                .parse::<SocketAddr>()
                .map(Some)
                .map_err(|e| format!("invalid address {a:?}: {e} (want HOST:PORT)")),
        }
    }

    pub fn listen_addr(&self) -> Result<SocketAddr, String> {
        self.listen
            .parse::<SocketAddr>()
            .map_err(|e| format!("invalid address {:?}: {e} (want HOST:PORT)", self.listen))
    }
}

/// Path of the example config inside the source tree.
pub fn example_config_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/watchcache.toml")
}

const EXAMPLE_CONFIG: &str = include_str!("../config/watchcache.toml");

fn parse_message(e: &toml::de::Error, text: &str) -> String {
    // toml's message names unknown and missing keys ("unknown field `x`");
    // for type errors the key is only in the source line, so quote the
    // line's key, never its value: the line may hold the etcd password
    // (`passwd = "..."` misspelt), and the error goes to the logs.
    let msg = e.message().trim().replace('\n', " ");
    match e.span() {
        Some(span) => {
            let start = span.start.min(text.len());
            let line_no = text[..start].matches('\n').count() + 1;
            let line = text.lines().nth(line_no - 1).unwrap_or("").trim();
            match line.split_once('=') {
                Some((key, value)) => format!(
                    "line {line_no}: `{} = ...`: {}",
                    key.trim(),
                    redact(&msg, value)
                ),
                None if line.starts_with('[') => format!("line {line_no}: `{line}`: {msg}"),
                None => format!("line {line_no}: {msg}"),
            }
        }
        None => msg,
    }
}

/// `msg` with each `quoted` part that is taken from `value` replaced by
/// `...` (toml quotes a wrongly typed value: "invalid type: integer `N`").
fn redact(msg: &str, value: &str) -> String {
    msg.split('`')
        .enumerate()
        .map(|(i, part)| {
            if i % 2 == 1 && !part.is_empty() && value.contains(part) {
                "..."
            } else {
                part
            }
        })
        .collect::<Vec<_>>()
        .join("`")
}

/// Upper bound of every `*_ms` setting: one year.
const MAX_DURATION_MS: u64 = 365 * 24 * 3600 * 1000;
/// etcd's largest lease TTL (`MaxLeaseTTL`), in seconds.
const MAX_LEASE_TTL_SECONDS: u64 = 9_000_000_000;

fn validate_duration(value: u64, zero_ok: bool, max: u64) -> Result<(), String> {
    if value == 0 && !zero_ok {
        Err("must be greater than 0".into())
    } else if value > max {
        Err(format!("must be at most {max}, got {value}"))
    } else {
        Ok(())
    }
}

fn validate_endpoint(ep: &str) -> Result<(), String> {
    let rest = ep
        .strip_prefix("http://")
        .or_else(|| ep.strip_prefix("https://"))
        .ok_or_else(|| format!("invalid endpoint {ep:?}: want http://HOST:PORT"))?;
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| format!("invalid endpoint {ep:?}: missing port"))?;
    if host.is_empty() {
        return Err(format!("invalid endpoint {ep:?}: missing host"));
    }
    port.trim_end_matches('/')
        .parse::<u16>()
        .map_err(|_| format!("invalid endpoint {ep:?}: bad port {port:?}"))?;
    Ok(())
}

/// An index path is a dotted field path like `spec.nodeName` (segments of
/// letters, digits, `_` and `-`).
pub fn validate_field_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("empty field path".into());
    }
    for seg in path.split('.') {
        if seg.is_empty()
            || !seg
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(format!(
                "unparsable field path {path:?}: want dotted segments like spec.nodeName"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feature_gates_as_kube_apiserver_takes_them() {
        let mut c = Config::example().server;
        assert!(c.response_compression && !c.sharded_list_and_watch);
        c.set_feature_gates("ShardedListAndWatch=true, APIResponseCompression=false")
            .expect("gates");
        assert!(!c.response_compression && c.sharded_list_and_watch);
        assert_eq!(
            c.set_feature_gates("Nope=true"),
            Err("unrecognized feature gate: Nope".into())
        );
        assert_eq!(
            c.set_feature_gates("ShardedListAndWatch=yes"),
            Err("invalid value of ShardedListAndWatch=yes, err: strconv.ParseBool: parsing \"yes\": invalid syntax".into())
        );
        assert_eq!(
            c.set_feature_gates("ShardedListAndWatch"),
            Err("missing bool value for ShardedListAndWatch".into())
        );
    }

    /// etcd credentials come as a pair, and the password never reaches
    /// `Debug` output (configs are logged).
    #[test]
    fn etcd_username_needs_password_and_password_is_redacted() {
        let res = "[[resources]]\nversion = \"v1\"\nkind = \"Pod\"\nplural = \"pods\"\n";
        let cfg = Config::parse(
            &format!("[etcd]\nusername = \"root\"\npassword = \"s3cret\"\n{res}"),
            "t.toml",
        )
        .expect("both set");
        assert_eq!(cfg.etcd.username.as_deref(), Some("root"));
        assert_eq!(cfg.etcd.password, Some(Password("s3cret".into())));
        assert!(!format!("{cfg:?}").contains("s3cret"));
        let err = Config::parse(&format!("[etcd]\nusername = \"root\"\n{res}"), "t.toml")
            .expect_err("username alone");
        assert!(err.to_string().contains("etcd.username"), "{err}");
    }

    #[test]
    fn example_config_is_valid() {
        let cfg = Config::example();
        assert!(cfg.resources.iter().any(|r| r.plural == "pods"));
        assert!(cfg.resources.iter().any(|r| !r.group.is_empty()));
    }

    /// config/kubernetes.toml follows kube-apiserver's key layout:
    /// `DefaultStorageFactory.ResourcePrefix` (the lowercased resource, no
    /// group) plus the compiled-in overrides, and group-prefixed keys for
    /// apiextensions/apiregistration.
    #[test]
    fn kubernetes_config_has_kube_apiserver_key_layout() {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/kubernetes.toml");
        let cfg = Config::load(&path).unwrap();
        let special = [
            ("", "replicationcontrollers", "controllers"),
            ("", "endpoints", "services/endpoints"),
            ("", "services", "services/specs"),
            ("", "nodes", "minions"),
            ("networking.k8s.io", "ingresses", "ingress"),
        ];
        for r in &cfg.resources {
            let want = match special
                .iter()
                .find(|(g, p, _)| *g == r.group && *p == r.plural)
            {
                Some((_, _, s)) => format!("/registry/{s}/"),
                None if ["apiextensions.k8s.io", "apiregistration.k8s.io"]
                    .contains(&r.group.as_str()) =>
                {
                    format!("/registry/{}/{}/", r.group, r.plural)
                }
                None => format!("/registry/{}/", r.plural),
            };
            assert_eq!(
                r.key_prefix(&cfg.etcd.prefix),
                want,
                "{}.{}",
                r.plural,
                r.group
            );
        }
        for plural in [
            "pods",
            "secrets",
            "deployments",
            "leases",
            "customresourcedefinitions",
        ] {
            assert!(cfg.resources.iter().any(|r| r.plural == plural), "{plural}");
        }
        let tls = cfg.etcd.tls.unwrap();
        assert_eq!(
            tls.ca_file.unwrap(),
            PathBuf::from("/etc/kubernetes/pki/etcd/ca.crt")
        );
    }

    #[test]
    fn tls_needs_https_and_vice_versa() {
        error_naming(
            &GOOD.replace("[etcd]", "[etcd.tls]\nca_file = \"/ca.crt\"\n[etcd]"),
            "etcd.tls",
        );
        error_naming(
            &GOOD.replace("http://127.0.0.1:2379", "https://127.0.0.1:2379"),
            "etcd.tls.ca_file",
        );
        let both = GOOD.replace(
            "\"http://127.0.0.1:2379\"",
            "\"https://127.0.0.1:2379\", \"http://127.0.0.1:2380\"",
        );
        error_naming(&both, "etcd.endpoints[1]");
        let ok = GOOD
            .replace("http://127.0.0.1:2379", "https://127.0.0.1:2379")
            .replace(
                "[[resources]]",
                "[etcd.tls]\nca_file = \"/ca.crt\"\n\n[[resources]]",
            );
        Config::parse(&ok, "test.toml").unwrap();
        error_naming(&ok.replace("ca_file", "cafile"), "cafile");
    }

    #[test]
    fn key_prefix_core_and_group() {
        let cfg = Config::example();
        let pods = cfg.resources.iter().find(|r| r.plural == "pods").unwrap();
        assert_eq!(pods.key_prefix("/registry"), "/registry/pods/");
        let mut dep = pods.clone();
        dep.group = "apps".into();
        dep.plural = "deployments".into();
        assert_eq!(dep.key_prefix("/registry/"), "/registry/apps/deployments/");
        assert_eq!(dep.api_version(), "apps/v1");
        assert_eq!(dep.base_path(), "/apis/apps/v1");
    }

    #[test]
    fn storage_encoding_defaults_to_json_and_protobuf_needs_a_builtin_type() {
        let cfg = Config::parse(GOOD, "test.toml").expect("valid");
        assert_eq!(cfg.resources[0].storage_encoding, StorageEncoding::Json);
        let pb = format!("{GOOD}storage_encoding = \"protobuf\"\n");
        let cfg = Config::parse(&pb, "test.toml").expect("Pod can be stored as protobuf");
        assert_eq!(cfg.resources[0].storage_encoding, StorageEncoding::Protobuf);
        let widget = pb.replace("kind = \"Pod\"", "kind = \"Widget\"");
        let msg = error_naming(&widget, "resources[0].storage_encoding");
        assert!(msg.contains("v1 Widget"), "{msg}");
        let bad = format!("{GOOD}storage_encoding = \"yaml\"\n");
        assert!(Config::parse(&bad, "test.toml").is_err());
    }

    const GOOD: &str = r#"
listen = "127.0.0.1:8080"
[etcd]
endpoints = ["http://127.0.0.1:2379"]
[[resources]]
version = "v1"
kind = "Pod"
plural = "pods"
namespaced = true
indexes = ["spec.nodeName"]
"#;

    /// Parses `text` and returns the error message, which must name `field`.
    fn error_naming(text: &str, field: &str) -> String {
        let err = Config::parse(text, "test.toml").expect_err("config should be rejected");
        let msg = err.to_string();
        assert!(msg.contains("test.toml"), "message names the file: {msg}");
        assert!(msg.contains(field), "message names `{field}`: {msg}");
        msg
    }

    #[test]
    fn good_config_parses_with_defaults() {
        let cfg = Config::parse(GOOD, "test.toml").unwrap();
        assert_eq!(cfg.resources[0].history_capacity, None);
        assert_eq!(cfg.resources[0].history_min_seconds, 75);
        assert_eq!(cfg.resources[0].history_min_events, 100);
        assert_eq!(cfg.resources[0].history_max_events, 102_400);
        assert_eq!(cfg.resources[0].history_max_bytes, 256 << 20);
        assert_eq!(cfg.etcd.prefix, "/registry");
        assert_eq!(cfg.server.max_body_bytes, DEFAULT_MAX_BODY_BYTES);
    }

    /// A bad line is named by its key, never quoted whole: the value may be
    /// the etcd password, and the message goes to the logs.
    #[test]
    fn parse_errors_never_quote_a_value() {
        let etcd = "[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n";
        for (bad, key) in [
            (format!("{etcd}passwd = \"s3cret-a\"\n"), "passwd"),
            (format!("{etcd}password = 13371337\n"), "password"),
            (format!("{etcd}password = \"s3cret-b\n"), "password"),
        ] {
            let msg = Config::parse(&bad, "test.toml")
                .expect_err("rejected")
                .to_string();
            assert!(msg.contains(key), "names the key: {msg}");
            for secret in ["s3cret", "13371337"] {
                assert!(!msg.contains(secret), "quotes a value: {msg}");
            }
        }
    }

    #[test]
    fn unknown_top_level_field() {
        error_naming(&format!("bogus = 1\n{GOOD}"), "bogus");
    }

    #[test]
    fn unknown_resource_field() {
        error_naming(
            &GOOD.replace("namespaced = true", "namespaced = true\ncolour = 1"),
            "colour",
        );
    }

    #[test]
    fn bad_listen_address() {
        error_naming(&GOOD.replace("127.0.0.1:8080", "localhost"), "listen");
    }

    #[test]
    fn grpc_max_request_bytes_defaults_to_etcds_and_is_checked() {
        let cfg = Config::parse(GOOD, "test.toml").unwrap();
        assert_eq!(cfg.grpc_max_request_bytes, 2 << 20);
        error_naming(
            &format!("grpc_max_request_bytes = 0\n{GOOD}"),
            "grpc_max_request_bytes",
        );
        let big =
            Config::parse(&format!("grpc_max_request_bytes = 11010048\n{GOOD}"), "t").unwrap();
        assert_eq!(big.grpc_max_request_bytes, 11_010_048);
    }

    #[test]
    fn grpc_listen_is_off_by_default_and_checked() {
        let cfg = Config::parse(GOOD, "test.toml").unwrap();
        assert_eq!(cfg.grpc_listen, None);
        assert_eq!(cfg.grpc_listen_addr(), Ok(None));
        let on = format!("grpc_listen = \"127.0.0.1:2379\"\n{GOOD}");
        let cfg = Config::parse(&on, "test.toml").unwrap();
        assert_eq!(
            cfg.grpc_listen_addr(),
            Ok(Some("127.0.0.1:2379".parse().unwrap()))
        );
        error_naming(
            &format!("grpc_listen = \"localhost\"\n{GOOD}"),
            "grpc_listen",
        );
    }

    #[test]
    fn grpc_cache_prefixes_default_to_none_and_are_checked() {
        let cfg = Config::parse(GOOD, "test.toml").unwrap();
        assert!(cfg.grpc_cache_prefixes.is_empty());
        let some = format!("grpc_cache_prefixes = [\"compact_rev_key\", \"/registry/x/\"]\n{GOOD}");
        let cfg = Config::parse(&some, "test.toml").unwrap();
        assert_eq!(cfg.grpc_cache_prefixes, ["compact_rev_key", "/registry/x/"]);
        error_naming(
            &format!("grpc_cache_prefixes = [\"/a/\", \"\"]\n{GOOD}"),
            "grpc_cache_prefixes[1]",
        );
    }

    #[test]
    fn bad_etcd_endpoint() {
        error_naming(
            &GOOD.replace("http://127.0.0.1:2379", "127.0.0.1"),
            "etcd.endpoints[0]",
        );
        error_naming(
            &GOOD.replace("http://127.0.0.1:2379", "http://h:port"),
            "etcd.endpoints[0]",
        );
    }

    #[test]
    fn empty_resources() {
        let text = "listen = \"127.0.0.1:8080\"\n";
        error_naming(text, "resources");
        error_naming(&format!("{text}resources = []\n"), "resources");
    }

    #[test]
    fn duplicate_plural() {
        let dup =
            format!("{GOOD}\n[[resources]]\nversion = \"v1\"\nkind = \"Pod\"\nplural = \"pods\"\n");
        let msg = error_naming(&dup, "resources[1].plural");
        assert!(msg.contains("duplicate"), "{msg}");
    }

    #[test]
    fn same_plural_in_another_group_is_fine() {
        let other = format!(
            "{GOOD}\n[[resources]]\ngroup = \"example.com\"\nversion = \"v1\"\nkind = \"Pod\"\nplural = \"pods\"\n"
        );
        Config::parse(&other, "test.toml").unwrap();
    }

    #[test]
    fn unparsable_index_path() {
        error_naming(
            &GOOD.replace("spec.nodeName", "spec..nodeName"),
            "resources[0].indexes[0]",
        );
        error_naming(
            &GOOD.replace("spec.nodeName", "spec.node name"),
            "resources[0].indexes[0]",
        );
    }

    #[test]
    fn zero_history() {
        error_naming(
            &GOOD.replace(
                "namespaced = true",
                "namespaced = true\nhistory_capacity = 0",
            ),
            "resources[0].history_capacity",
        );
    }

    #[test]
    fn missing_required_field() {
        error_naming(&GOOD.replace("kind = \"Pod\"\n", ""), "kind");
    }

    #[test]
    fn bad_plural_and_kind_and_group() {
        error_naming(
            &GOOD.replace("plural = \"pods\"", "plural = \"Pods\""),
            "resources[0].plural",
        );
        error_naming(
            &GOOD.replace("kind = \"Pod\"", "kind = \"Po d\""),
            "resources[0].kind",
        );
        error_naming(
            &GOOD.replace(
                "version = \"v1\"",
                "group = \"Bad_Group\"\nversion = \"v1\"",
            ),
            "resources[0].group",
        );
    }

    #[test]
    fn wrong_type() {
        error_naming(
            &GOOD.replace("namespaced = true", "namespaced = \"yes\""),
            "namespaced",
        );
    }

    #[test]
    fn zero_or_huge_durations() {
        error_naming(
            &GOOD.replace("[etcd]", "[server]\nbookmark_interval_ms = 0\n[etcd]"),
            "server.bookmark_interval_ms",
        );
        error_naming(
            &GOOD.replace(
                "[etcd]",
                "[etcd]\nrequest_timeout_ms = 18446744073709551615",
            ),
            "etcd.request_timeout_ms",
        );
        error_naming(
            &GOOD.replace(
                "[etcd]",
                "[server]\nmin_request_timeout_seconds = 9223372036854775807\n[etcd]",
            ),
            "server.min_request_timeout_seconds",
        );
        error_naming(
            &GOOD.replace(
                "[etcd]",
                "[etcd]\nlease_reuse_seconds = 18446744073709551615",
            ),
            "etcd.lease_reuse_seconds",
        );
        error_naming(
            &GOOD.replace(
                "namespaced = true",
                "namespaced = true\nttl_seconds = 18446744073709551615",
            ),
            "resources[0].ttl_seconds",
        );
    }

    #[test]
    fn zero_ttl_and_bad_prefix() {
        error_naming(
            &GOOD.replace("namespaced = true", "namespaced = true\nttl_seconds = 0"),
            "resources[0].ttl_seconds",
        );
        error_naming(
            &GOOD.replace("[etcd]", "[etcd]\nprefix = \"registry\""),
            "etcd.prefix",
        );
    }

    #[test]
    fn security_sections() {
        let text = GOOD.replace(
            "[etcd]",
            "[server.tls]\ncert_file = \"/tls.crt\"\nprivate_key_file = \"/tls.key\"\n[server.authentication]\nclient_ca_file = \"/ca.crt\"\ntoken_auth_file = \"/tokens.csv\"\n[server.authorization]\nmode = \"RBAC\"\npolicy_files = [\"/rbac.yaml\"]\n[etcd]",
        );
        let cfg = Config::parse(&text, "test.toml").unwrap();
        let tls = cfg.server.tls.as_ref().unwrap();
        assert_eq!(tls.min_version, "VersionTLS12");
        assert_eq!(cfg.server.authorization.mode, AuthorizationMode::Rbac);
        // Authenticators configured: anonymous defaults to off.
        assert!(!cfg.server.authentication.anonymous_enabled());
        assert!(
            Config::parse(GOOD, "t")
                .unwrap()
                .server
                .authentication
                .anonymous_enabled()
        );
        error_naming(
            &text.replace(
                "[server.authentication]",
                "min_version = \"VersionTLS11\"\n[server.authentication]",
            ),
            "server.tls.min_version",
        );
        error_naming(
            &GOOD.replace(
                "[etcd]",
                "[server.authentication]\nclient_ca_file = \"/ca.crt\"\n[etcd]",
            ),
            "server.authentication.client_ca_file",
        );
        error_naming(
            &GOOD.replace(
                "[etcd]",
                "[server.authorization]\npolicy_files = [\"/p.yaml\"]\n[etcd]",
            ),
            "server.authorization.policy_files",
        );
        error_naming(
            &GOOD.replace("[etcd]", "[server.authorization]\nmode = \"ABAC\"\n[etcd]"),
            "mode",
        );
    }
}
