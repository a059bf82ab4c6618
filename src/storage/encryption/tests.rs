//! Vectors made by tests/fixtures/encryption/gen_vectors.py (Python
//! `cryptography` + PyNaCl), i.e. outside this code path.

use super::*;

const VECTORS: &str = include_str!("../../../tests/fixtures/encryption/vectors.json");

#[derive(Deserialize)]
struct Vectors {
    vectors: Vec<Vector>,
}

#[derive(Deserialize, Clone)]
struct Vector {
    provider: String,
    key_name: String,
    secret: String,
    etcd_key: String,
    plaintext_b64: String,
    stored_b64: String,
}

impl Vector {
    fn stored(&self) -> Vec<u8> {
        b64(&self.stored_b64)
    }
    fn plaintext(&self) -> Vec<u8> {
        b64(&self.plaintext_b64)
    }
}

fn b64(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}

fn vectors() -> Vec<Vector> {
    serde_json::from_str::<Vectors>(VECTORS).unwrap().vectors
}

fn resource(group: &str, plural: &str) -> ResourceConfig {
    ResourceConfig {
        group: group.into(),
        version: "v1".into(),
        kind: "Thing".into(),
        plural: plural.into(),
        namespaced: true,
        indexes: vec![],
        history_capacity: Some(10),
        key_prefix: None,
        ttl_seconds: None,
        storage_encoding: Default::default(),
        short_names: None,
        categories: None,
        ..Default::default()
    }
}

fn resources() -> Vec<ResourceConfig> {
    vec![
        resource("", "secrets"),
        resource("", "configmaps"),
        resource("apps", "deployments"),
        resource("example.com", "widgets"),
    ]
}

/// A config for `secrets` with the given provider YAML items.
fn config(providers: &str) -> String {
    format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n  - resources: [secrets]\n    providers:\n{providers}"
    )
}

fn provider(kind: &str, name: &str, secret: &str) -> String {
    format!(
        "      - {kind}:\n          keys:\n            - name: {name}\n              secret: {secret}\n"
    )
}

fn transformer(text: &str) -> EncryptionTransformer {
    EncryptionTransformer::parse(text, "enc.yaml", &resources(), "/registry").unwrap()
}

fn read(t: &EncryptionTransformer, key: &str, v: &[u8]) -> Result<Vec<u8>, TransformError> {
    match t.from_storage(key, Bytes::copy_from_slice(v)) {
        Ok(b) => Ok(b.to_vec()),
        Err(StorageError::Transformation { error, .. }) => Err(error),
        Err(e) => panic!("unexpected error {e}"),
    }
}

fn write(t: &EncryptionTransformer, key: &str, v: &[u8]) -> Vec<u8> {
    t.to_storage(key, Bytes::copy_from_slice(v))
        .unwrap()
        .to_vec()
}

#[test]
fn every_vector_decrypts() {
    let vs = vectors();
    assert!(vs.len() >= 18);
    for v in vs {
        let t = transformer(&config(&provider(&v.provider, &v.key_name, &v.secret)));
        let got = read(&t, &v.etcd_key, &v.stored())
            .unwrap_or_else(|e| panic!("{} {} {}: {e}", v.provider, v.key_name, v.etcd_key));
        assert_eq!(got, v.plaintext(), "{} {}", v.provider, v.key_name);
    }
}

#[test]
fn writes_round_trip_with_kubernetes_layout() {
    for v in vectors() {
        let t = transformer(&config(&provider(&v.provider, &v.key_name, &v.secret)));
        let plain = v.plaintext();
        let stored = write(&t, &v.etcd_key, &plain);
        let prefix = format!("k8s:enc:{}:v1:{}:", v.provider, v.key_name);
        assert!(stored.starts_with(prefix.as_bytes()));
        let body = &stored[prefix.len()..];
        // nonce/IV + ciphertext (+ tag) lengths as kube-apiserver lays them out.
        let want = match v.provider.as_str() {
            "aesgcm" => 12 + plain.len() + 16,
            "aescbc" => 16 + (plain.len() / 16 + 1) * 16,
            _ => 24 + 16 + plain.len(),
        };
        assert_eq!(body.len(), want, "{}", v.provider);
        assert_eq!(read(&t, &v.etcd_key, &stored).unwrap(), plain);
        // Fresh random nonce per write.
        assert_ne!(write(&t, &v.etcd_key, &plain), stored);
    }
}

#[test]
fn aesgcm_binds_the_etcd_key() {
    let v = &vectors()[0];
    assert_eq!(v.provider, "aesgcm");
    let t = transformer(&config(&provider("aesgcm", &v.key_name, &v.secret)));
    let err = read(&t, "/registry/secrets/default/other", &v.stored()).unwrap_err();
    assert_eq!(err.reason(), "decrypt_failed");
}

#[test]
fn rotation_reads_old_key_writes_new() {
    let old = vectors()
        .into_iter()
        .find(|v| v.provider == "aesgcm" && v.key_name == "key1")
        .unwrap();
    let new_secret = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
    let text = config(&format!(
        "{}{}",
        provider("aesgcm", "key2", &new_secret),
        provider("aesgcm", "key1", &old.secret)
    ));
    let t = transformer(&text);
    assert_eq!(
        read(&t, &old.etcd_key, &old.stored()).unwrap(),
        old.plaintext()
    );
    let stored = write(&t, &old.etcd_key, b"{}");
    assert!(stored.starts_with(b"k8s:enc:aesgcm:v1:key2:"));
    // Across providers too: secretbox first, the aescbc vector still reads.
    let cbc = vectors()
        .into_iter()
        .find(|v| v.provider == "aescbc")
        .unwrap();
    let text = config(&format!(
        "{}{}",
        provider("secretbox", "new", &new_secret),
        provider("aescbc", &cbc.key_name, &cbc.secret)
    ));
    let t = transformer(&text);
    assert_eq!(
        read(&t, &cbc.etcd_key, &cbc.stored()).unwrap(),
        cbc.plaintext()
    );
    assert!(write(&t, &cbc.etcd_key, b"{}").starts_with(b"k8s:enc:secretbox:v1:new:"));
}

fn stale(t: &EncryptionTransformer, key: &str, v: &[u8]) -> bool {
    t.from_storage_checked(key, Bytes::copy_from_slice(v))
        .unwrap()
        .1
}

#[test]
fn reads_report_staleness_like_kube_apiserver() {
    let old = vectors()
        .into_iter()
        .find(|v| v.provider == "aesgcm" && v.key_name == "key1")
        .unwrap();
    let key = &old.etcd_key;
    let new_secret = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
    // key2 writes, key1 still reads: key1's value is stale, key2's is not.
    let t = transformer(&config(&format!(
        "{}{}      - identity: {{}}\n",
        provider("aesgcm", "key2", &new_secret),
        provider("aesgcm", "key1", &old.secret)
    )));
    assert!(stale(&t, key, &old.stored()));
    assert!(!stale(&t, key, &write(&t, key, b"{}")));
    // Identity read while aesgcm encrypts: stale (the value is plaintext).
    assert!(stale(&t, key, b"{\"a\":1}"));
    // The vector's own key first: current.
    let t = transformer(&config(&provider("aesgcm", "key1", &old.secret)));
    assert!(!stale(&t, key, &old.stored()));
    // Identity first: plaintext is current, an encrypted value is stale.
    let t = transformer(&config(&format!(
        "      - identity: {{}}\n{}",
        provider("aesgcm", "key1", &old.secret)
    )));
    assert!(!stale(&t, key, b"{\"a\":1}"));
    assert!(stale(&t, key, &old.stored()));
    // A key outside every configured resource (identity): never stale.
    assert!(!stale(&t, "/registry/other/x", b"{}"));
}

#[test]
fn wrong_key_fails_authentication() {
    let wrong = base64::engine::general_purpose::STANDARD.encode([1u8; 32]);
    for v in vectors() {
        if v.secret.len() != wrong.len() || v.provider == "aescbc" {
            continue;
        }
        let t = transformer(&config(&provider(&v.provider, &v.key_name, &wrong)));
        let err = read(&t, &v.etcd_key, &v.stored()).unwrap_err();
        assert_eq!(err.reason(), "decrypt_failed", "{}: {err}", v.provider);
    }
    // CBC is not authenticated: a wrong key shows as bad padding.
    let cbc = vectors()
        .into_iter()
        .find(|v| v.provider == "aescbc" && v.key_name == "key1" && !v.plaintext().is_empty())
        .unwrap();
    let t = transformer(&config(&provider("aescbc", "key1", &wrong)));
    assert!(read(&t, &cbc.etcd_key, &cbc.stored()).is_err());
}

#[test]
fn truncated_values() {
    for v in vectors() {
        let t = transformer(&config(&provider(&v.provider, &v.key_name, &v.secret)));
        let prefix_len = format!("k8s:enc:{}:v1:{}:", v.provider, v.key_name).len();
        let stored = v.stored();
        let err = read(&t, &v.etcd_key, &stored[..prefix_len + 5]).unwrap_err();
        assert_eq!(err.reason(), "truncated", "{}: {err}", v.provider);
        // Not a whole block (CBC) or a cut tag (AEAD): never the plaintext.
        assert!(read(&t, &v.etcd_key, &stored[..stored.len() - 1]).is_err());
    }
}

#[test]
fn tampered_tag_or_ciphertext() {
    for v in vectors() {
        if v.provider == "aescbc" {
            continue;
        }
        let t = transformer(&config(&provider(&v.provider, &v.key_name, &v.secret)));
        let mut stored = v.stored();
        let last = stored.len() - 1;
        stored[last] ^= 1;
        let err = read(&t, &v.etcd_key, &stored).unwrap_err();
        assert_eq!(err.reason(), "decrypt_failed", "{}", v.provider);
        // secretbox: the tag sits right after the nonce.
        let mut stored = v.stored();
        let prefix_len = format!("k8s:enc:{}:v1:{}:", v.provider, v.key_name).len();
        stored[prefix_len + 24] ^= 0x80;
        assert!(read(&t, &v.etcd_key, &stored).is_err());
    }
}

#[test]
fn key_not_configured_is_no_matching_provider() {
    let v = &vectors()[0];
    let t = transformer(&config(&provider("aesgcm", "other", &v.secret)));
    let err = read(&t, &v.etcd_key, &v.stored()).unwrap_err();
    assert_eq!(err.reason(), "no_matching_provider");
    let msg = err.to_string();
    assert!(msg.contains("k8s:enc:aesgcm:v1:key1"), "{msg}");
    // Plain data with no identity provider is unreadable too.
    let err = read(&t, &v.etcd_key, b"{\"kind\":\"Secret\"}").unwrap_err();
    assert_eq!(err.reason(), "no_matching_provider");
}

/// kube-apiserver's only rule for a key name is that it is not empty
/// (validateKey); the name goes into the prefix as is.
#[test]
fn key_names_kube_apiserver_accepts() {
    let secret = base64::engine::general_purpose::STANDARD.encode([5u8; 32]);
    let key = "/registry/secrets/ns/x";
    let t = transformer(&config(&provider("aescbc", "k:1", &secret)));
    let stored = write(&t, key, b"{\"a\":1}");
    assert!(stored.starts_with(b"k8s:enc:aescbc:v1:k:1:"));
    assert_eq!(read(&t, key, &stored).unwrap(), b"{\"a\":1}");
    // A value kube-apiserver wrote: the aescbc vector under that name (CBC
    // does not bind the prefix, so only the prefix changes).
    let cbc = vectors()
        .into_iter()
        .find(|v| v.provider == "aescbc")
        .unwrap();
    let old_prefix = format!("k8s:enc:aescbc:v1:{}:", cbc.key_name);
    let body = &cbc.stored()[old_prefix.len()..];
    let t = transformer(&config(&provider("aescbc", "key:2024-01-01", &cbc.secret)));
    let stored = [&b"k8s:enc:aescbc:v1:key:2024-01-01:"[..], body].concat();
    assert_eq!(read(&t, &cbc.etcd_key, &stored).unwrap(), cbc.plaintext());
    for name in ["my key", "cl\u{e9}"] {
        let t = transformer(&config(&provider("aesgcm", name, &secret)));
        let prefix = format!("k8s:enc:aesgcm:v1:{name}:");
        assert!(
            write(&t, key, b"{}").starts_with(prefix.as_bytes()),
            "{name}"
        );
    }
}

/// Overlapping prefixes (`k` and `k:1`) and a name used twice: every
/// provider whose prefix matches is tried in order, past failures, as
/// kube-apiserver's prefixTransformers do.
#[test]
fn every_matching_prefix_is_tried() {
    let a = base64::engine::general_purpose::STANDARD.encode([5u8; 32]);
    let b = base64::engine::general_purpose::STANDARD.encode([6u8; 32]);
    let key = "/registry/secrets/ns/x";
    let by_k1 = write(
        &transformer(&config(&provider("aesgcm", "k:1", &b))),
        key,
        b"one",
    );
    let t = transformer(&config(&format!(
        "{}{}",
        provider("aesgcm", "k", &a),
        provider("aesgcm", "k:1", &b)
    )));
    assert_eq!(read(&t, key, &by_k1).unwrap(), b"one");
    assert!(stale(&t, key, &by_k1));
    // The same name in two provider entries, and twice in one key list.
    let dup = transformer(&config(&format!(
        "{}{}",
        provider("aesgcm", "dup", &a),
        provider("aesgcm", "dup", &b)
    )));
    let dup_keys = transformer(&config(&format!(
        "      - aesgcm:\n          keys:\n            - {{name: dup, secret: {a}}}\n            - {{name: dup, secret: {b}}}\n"
    )));
    let by_second = write(
        &transformer(&config(&provider("aesgcm", "dup", &b))),
        key,
        b"two",
    );
    for t in [&dup, &dup_keys] {
        assert_eq!(read(t, key, &by_second).unwrap(), b"two");
        assert!(stale(t, key, &by_second));
        let by_first = write(t, key, b"three");
        assert_eq!(read(t, key, &by_first).unwrap(), b"three");
        assert!(!stale(t, key, &by_first));
    }
    // Neither key: the failure of a matching key is reported.
    let other = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
    let by_other = write(
        &transformer(&config(&provider("aesgcm", "dup", &other))),
        key,
        b"four",
    );
    assert_eq!(
        read(&dup, key, &by_other).unwrap_err().reason(),
        "decrypt_failed"
    );
}

#[test]
fn identity_reads_plain_and_writes_plain() {
    let v = &vectors()[0];
    let text = config(&format!(
        "      - identity: {{}}\n{}",
        provider("aesgcm", &v.key_name, &v.secret)
    ));
    let t = transformer(&text);
    assert_eq!(read(&t, &v.etcd_key, b"{\"a\":1}").unwrap(), b"{\"a\":1}");
    assert_eq!(read(&t, &v.etcd_key, &v.stored()).unwrap(), v.plaintext());
    assert_eq!(write(&t, &v.etcd_key, b"{\"a\":1}"), b"{\"a\":1}");
}

#[test]
fn resources_match_like_kube_apiserver() {
    let key = base64::engine::general_purpose::STANDARD.encode([3u8; 32]);
    let text = format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n  - resources: [secrets]\n    providers:\n{}  - resources: ['*.apps']\n    providers:\n{}  - resources: ['*.*']\n    providers:\n{}",
        provider("aesgcm", "s", &key),
        provider("aescbc", "a", &key),
        provider("secretbox", "all", &key),
    );
    let t = transformer(&text);
    let cases = [
        ("/registry/secrets/ns/x", "k8s:enc:aesgcm:v1:s:"),
        ("/registry/apps/deployments/ns/x", "k8s:enc:aescbc:v1:a:"),
        ("/registry/configmaps/ns/x", "k8s:enc:secretbox:v1:all:"),
        (
            "/registry/example.com/widgets/ns/x",
            "k8s:enc:secretbox:v1:all:",
        ),
    ];
    for (k, prefix) in cases {
        assert!(write(&t, k, b"{}").starts_with(prefix.as_bytes()), "{k}");
    }
    // Only secrets configured: other resources stay identity, which refuses
    // encrypted data.
    let t = transformer(&config(&provider("aesgcm", "s", &key)));
    assert_eq!(write(&t, "/registry/configmaps/ns/x", b"{}"), b"{}");
    let enc = write(&t, "/registry/secrets/ns/x", b"{}");
    assert!(read(&t, "/registry/configmaps/ns/x", &enc).is_err());
    // `*.` is the core group only.
    let text = format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n  - resources: ['*.']\n    providers:\n{}",
        provider("aesgcm", "core", &key)
    );
    let t = transformer(&text);
    assert!(write(&t, "/registry/configmaps/ns/x", b"{}").starts_with(b"k8s:enc:aesgcm:v1:core:"));
    assert_eq!(write(&t, "/registry/apps/deployments/ns/x", b"{}"), b"{}");
}

#[test]
fn json_config_parses() {
    let v = &vectors()[0];
    let text = format!(
        r#"{{"apiVersion":"apiserver.config.k8s.io/v1","kind":"EncryptionConfiguration","resources":[{{"resources":["secrets"],"providers":[{{"aesgcm":{{"keys":[{{"name":"{}","secret":"{}"}}]}}}},{{"identity":{{}}}}]}}]}}"#,
        v.key_name, v.secret
    );
    let t = transformer(&text);
    assert_eq!(read(&t, &v.etcd_key, &v.stored()).unwrap(), v.plaintext());
}

#[test]
fn failures_are_counted_by_resource_and_reason() {
    let v = &vectors()[0];
    let t = transformer(&config(&provider("aesgcm", "other", &v.secret)));
    let c = crate::metrics::metrics()
        .transformation_failures
        .with_label_values(&["secrets", "no_matching_provider"]);
    let before = c.get();
    let _ = read(&t, &v.etcd_key, &v.stored());
    assert!(c.get() > before);
}

/// The config error, which must name `field`.
fn config_error(text: &str, field: &str) -> String {
    let err = EncryptionTransformer::parse(text, "enc.yaml", &resources(), "/registry")
        .expect_err("config should be rejected");
    let msg = err.to_string();
    assert!(msg.contains("enc.yaml"), "names the file: {msg}");
    assert!(msg.contains(field), "names `{field}`: {msg}");
    msg
}

/// A YAML mistake next to a key is reported by its place, never by
/// quoting the lines around it.
#[test]
fn syntax_errors_do_not_echo_the_keys() {
    let key = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
    let broken = format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n  - resources: [secrets]\n    providers:\n      - aesgcm:\n          keys:\n            - name: k\n              secret: {key}\n             bad: [\n"
    );
    let err = EncryptionTransformer::parse(&broken, "enc.yaml", &resources(), "/registry")
        .expect_err("not YAML");
    let msg = err.to_string();
    assert!(msg.contains("enc.yaml"), "{msg}");
    assert!(!msg.contains(&key), "never echo a key: {msg}");
    assert!(!msg.contains(&key[..12]), "not even part of one: {msg}");
}

#[test]
fn malformed_configs_name_the_field() {
    let key = base64::engine::general_purpose::STANDARD.encode([3u8; 32]);
    config_error(&config(&provider("aesgmc", "k", &key)), "aesgmc");
    config_error(
        &config(&provider("aesgcm", "k", "not base64!")),
        "resources[0].providers[0].aesgcm.keys[0].secret",
    );
    let short = base64::engine::general_purpose::STANDARD.encode([3u8; 20]);
    let msg = config_error(
        &config(&provider("aesgcm", "k", &short)),
        "resources[0].providers[0].aesgcm.keys[0].secret",
    );
    assert!(!msg.contains(&short), "never echo a secret: {msg}");
    config_error(
        &config(&provider("secretbox", "k", &short)),
        "resources[0].providers[0].secretbox.keys[0].secret",
    );
    config_error(
        &config(&provider("aesgcm", "", &key)),
        "resources[0].providers[0].aesgcm.keys[0].name",
    );
    config_error(
        &config("      - kms:\n          name: x\n"),
        "resources[0].providers[0].kms",
    );
    config_error(&config("      - {}\n"), "resources[0].providers[0]");
    config_error(
        &config(&format!(
            "      - identity: {{}}\n        aesgcm:\n          keys: [{{name: k, secret: {key}}}]\n"
        )),
        "resources[0].providers[0]",
    );
    config_error(
        &config(&provider("aesgcm", "k", &key)).replace("apiserver.config.k8s.io/v1", "v1"),
        "apiVersion",
    );
    config_error(
        &config(&provider("aesgcm", "k", &key)).replace("[secrets]", "[Secrets]"),
        "resources[0].resources[0]",
    );
    config_error(
        &config(&provider("aesgcm", "k", &key)).replace("[secrets]", "['*']"),
        "resources[0].resources[0]",
    );
    config_error(
        &config(&provider("aesgcm", "k", &key)).replace("[secrets]", "['*.*', secrets]"),
        "resources[0].resources[1]",
    );
    config_error(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources: []\n",
        "resources",
    );
    config_error("{not yaml", "enc.yaml");
}
