//! Fronting a production-like etcd: mutual TLS (certificates made by rcgen,
//! etcd run with `--client-cert-auth --trusted-ca-file`) and kube-apiserver's
//! encryption at rest (values made by tests/fixtures/encryption/gen_vectors.py).
mod common;

use std::process::Command;
use std::time::Duration;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use base64::Engine;
use serde_json::{Value, json};

use common::pki::Pki;
use common::{Daemon, PrivateEtcd, eventually};
use watchcache::config::{EtcdConfig, EtcdTlsConfig};
use watchcache::storage::{ListOptions, Storage, WriteOptions};

const SECRETS: &str = "\n[[resources]]\nversion = \"v1\"\nkind = \"Secret\"\nplural = \"secrets\"\nnamespaced = true\n";

fn tls_section(pki: &Pki, ca: &str, cert: Option<(&str, &str)>) -> String {
    let mut s = format!("[etcd.tls]\nca_file = \"{}\"\n", pki.path(ca).display());
    if let Some((c, k)) = cert {
        s.push_str(&format!(
            "cert_file = \"{}\"\nkey_file = \"{}\"\n",
            pki.path(c).display(),
            pki.path(k).display()
        ));
    }
    s
}

/// `[etcd]` keys, then `extra_etcd` (still in `[etcd]`), then `tables`
/// (e.g. `[etcd.tls]`), then the test resources and `secrets`.
fn config(endpoint: &str, prefix: &str, extra_etcd: &str, tables: &str) -> String {
    let base = common::daemon_config(endpoint, prefix, extra_etcd);
    // daemon_config ends with the resources; tables go before them.
    let (head, resources) = base
        .split_once("\n[[resources]]")
        .expect("daemon_config has resources");
    format!("{head}\n{tables}\n[[resources]]{resources}{SECRETS}")
}

/// Runs the daemon expecting it to stop at start-up: (exit code, stderr).
///
/// The start-up TLS check gives an endpoint that does not answer within
/// the dial timeout the benefit of the doubt (the connection is lazy), so a
/// starved machine could let a daemon that should refuse go on serving: the
/// check gets 10 s here, and a daemon still running after 60 s fails the
/// test instead of hanging it.
fn run_expecting_exit(config_text: &str, args: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("watchcache.toml");
    let text = config_text.replace("dial_timeout_ms = 1000", "dial_timeout_ms = 10000");
    std::fs::write(&path, text).unwrap();
    let stderr_path = dir.path().join("stderr");
    let mut child = Command::new(env!("CARGO_BIN_EXE_watchcache"))
        .arg("--config")
        .arg(&path)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the daemon did not stop at start-up; stderr:\n{}",
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        status.code(),
        std::fs::read_to_string(&stderr_path).unwrap_or_default(),
    )
}

async fn tls_etcd(pki: &Pki) -> PrivateEtcd {
    PrivateEtcd::start_tls(pki.etcd_server_tls())
        .await
        .expect("start TLS etcd")
}

fn pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": {"nodeName": "n1"}})
}

/// Whether `url` (a verbose `/readyz`) answers 503 with a body naming every
/// one of `needles` within 30 s.
async fn readyz_fails_naming(http: &reqwest::Client, url: &str, needles: &[&str]) -> bool {
    eventually(Duration::from_secs(30), || async move {
        match http.get(url).send().await {
            Ok(r) if r.status() == 503 => {
                let body = r.text().await.unwrap_or_default();
                needles.iter().all(|n| body.contains(n))
            }
            _ => false,
        }
    })
    .await
}

async fn metric(d: &Daemon, name_and_labels: &str) -> f64 {
    let text = reqwest::get(d.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with(name_and_labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

// ---- TLS -------------------------------------------------------------------

#[tokio::test]
async fn storage_talks_mtls_to_etcd() {
    let pki = Pki::generate();
    let etcd = tls_etcd(&pki).await;
    let prefix = common::unique_prefix("tls-storage");
    let cfg = EtcdConfig {
        tls: Some(EtcdTlsConfig {
            ca_file: Some(pki.path("ca.crt")),
            cert_file: Some(pki.path("client.crt")),
            key_file: Some(pki.path("client.key")),
            server_name: None,
        }),
        ..common::etcd_config(&etcd.endpoint(), &prefix)
    };
    assert!(etcd.endpoint().starts_with("https://"));
    let s = Storage::connect(&cfg).await.expect("connect");
    let key = format!("{prefix}/pods/default/a");
    let body = serde_json::to_vec(&pod("a")).unwrap();
    s.create(&key, body.clone().into(), &WriteOptions::default())
        .await
        .expect("create over mTLS");
    let got = s.get(&key, 0).await.expect("get over mTLS");
    assert_eq!(&got.value[..], &body[..]);
    let page = s
        .list(&format!("{prefix}/pods/"), &ListOptions::default())
        .await
        .unwrap();
    assert_eq!(page.items.len(), 1);
    assert_eq!(s.tls_error(), None);
}

#[tokio::test]
async fn daemon_serves_through_mtls_and_survives_rotation() {
    let pki = Pki::generate();
    let mut etcd = tls_etcd(&pki).await;
    let prefix = common::unique_prefix("tls-daemon");
    // The daemon's own copy of the CA (etcd keeps reading ca.crt).
    std::fs::copy(pki.path("ca.crt"), pki.path("daemon-ca.crt")).unwrap();
    // Files through the kube-apiserver-named flags, CA in the file.
    let text = config(
        &etcd.endpoint(),
        &prefix,
        "",
        &tls_section(&pki, "daemon-ca.crt", None),
    );
    let certfile = pki.path("client.crt").display().to_string();
    let keyfile = pki.path("client.key").display().to_string();
    let d = Daemon::start(
        &text,
        &["--etcd-certfile", &certfile, "--etcd-keyfile", &keyfile],
    )
    .await;
    let http = reqwest::Client::new();
    let ready = |d: &Daemon| {
        let (http, url) = (http.clone(), d.url("/readyz"));
        async move { matches!(http.get(&url).send().await, Ok(r) if r.status() == 200) }
    };
    assert!(
        eventually(Duration::from_secs(30), || ready(&d)).await,
        "ready over mTLS; log:\n{}",
        d.log()
    );
    let r = http
        .post(d.url("/api/v1/namespaces/default/pods"))
        .json(&pod("p1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let r = http
        .get(d.url("/api/v1/namespaces/default/pods/p1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // Rotate the trust to a CA that did not sign etcd, and make the daemon
    // reconnect: the handshake fails, shows in /readyz and the metric, and
    // the daemon keeps retrying.
    let good_ca = std::fs::read(pki.path("daemon-ca.crt")).unwrap();
    std::fs::copy(pki.path("other-ca.crt"), pki.path("daemon-ca.crt")).unwrap();
    let before = metric(&d, "watchcache_etcd_tls_handshake_errors_total").await;
    etcd.restart().await.expect("restart etcd");
    let url = d.url("/readyz?verbose");
    let failing = readyz_fails_naming(&http, &url, &["[-]etcd failed", "TLS handshake"]).await;
    assert!(failing, "readyz names the TLS failure; log:\n{}", d.log());
    let body = http.get(&url).send().await.unwrap().text().await.unwrap();
    assert!(body.contains(&etcd.endpoint()), "{body}");
    assert!(
        metric(&d, "watchcache_etcd_tls_handshake_errors_total").await > before,
        "handshake errors counted"
    );

    // Put the right CA back: the next retry uses the re-read file.
    std::fs::write(pki.path("daemon-ca.crt"), good_ca).unwrap();
    assert!(
        eventually(Duration::from_secs(30), || ready(&d)).await,
        "ready again after the CA file was fixed; log:\n{}",
        d.log()
    );
    let r = http
        .get(d.url("/api/v1/namespaces/default/pods/p1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // Now etcd refuses our (rotated) client certificate: reported after the
    // TLS 1.3 handshake, still shown as a failed handshake.
    let good_cert = std::fs::read(pki.path("client.crt")).unwrap();
    let good_key = std::fs::read(pki.path("client.key")).unwrap();
    std::fs::copy(pki.path("other-client.key"), pki.path("client.key")).unwrap();
    std::fs::copy(pki.path("other-client.crt"), pki.path("client.crt")).unwrap();
    etcd.restart().await.expect("restart etcd");
    let refused = readyz_fails_naming(&http, &url, &["TLS handshake", "alert"]).await;
    assert!(refused, "readyz names the refusal; log:\n{}", d.log());
    std::fs::write(pki.path("client.key"), good_key).unwrap();
    std::fs::write(pki.path("client.crt"), good_cert).unwrap();
    assert!(
        eventually(Duration::from_secs(30), || ready(&d)).await,
        "ready again with the right client certificate; log:\n{}",
        d.log()
    );
}

#[test]
fn help_lists_the_kube_apiserver_flags() {
    let out = Command::new(env!("CARGO_BIN_EXE_watchcache"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--etcd-cafile",
        "--etcd-certfile",
        "--etcd-keyfile",
        "--encryption-provider-config",
    ] {
        assert!(help.contains(flag), "{flag}: {help}");
    }
}

#[tokio::test]
async fn startup_refuses_wrong_ca_or_missing_client_cert() {
    let pki = Pki::generate();
    let etcd = tls_etcd(&pki).await;
    let prefix = common::unique_prefix("tls-refuse");

    // A CA that did not sign etcd's certificate.
    let text = config(
        &etcd.endpoint(),
        &prefix,
        "",
        &tls_section(&pki, "other-ca.crt", Some(("client.crt", "client.key"))),
    );
    let (code, err) = run_expecting_exit(&text, &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("etcd.tls.ca_file"), "{err}");
    assert!(err.contains("other-ca.crt"), "{err}");
    assert!(
        err.contains("UnknownIssuer") || err.contains("unknown issuer"),
        "{err}"
    );

    // No client certificate, while etcd requires one.
    let text = config(
        &etcd.endpoint(),
        &prefix,
        "",
        &tls_section(&pki, "ca.crt", None),
    );
    let (code, err) = run_expecting_exit(&text, &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("etcd.tls.cert_file"), "{err}");
    assert!(err.contains("refused the client certificate"), "{err}");

    // A client certificate from another CA.
    let text = config(
        &etcd.endpoint(),
        &prefix,
        "",
        &tls_section(
            &pki,
            "ca.crt",
            Some(("other-client.crt", "other-client.key")),
        ),
    );
    let (code, err) = run_expecting_exit(&text, &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("etcd.tls.cert_file"), "{err}");
    assert!(err.contains("other-client.crt"), "{err}");

    // A server name etcd's certificate is not valid for.
    let text = config(
        &etcd.endpoint(),
        &prefix,
        "",
        &format!(
            "{}server_name = \"wrong.example\"\n",
            tls_section(&pki, "ca.crt", Some(("client.crt", "client.key")))
        ),
    );
    let (code, err) = run_expecting_exit(&text, &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("etcd.tls.server_name") && err.contains("wrong.example"),
        "{err}"
    );

    // The right files (and a server name the certificate has) start fine.
    let text = config(
        &etcd.endpoint(),
        &prefix,
        "",
        &format!(
            "{}server_name = \"localhost\"\n",
            tls_section(&pki, "ca.crt", Some(("client.crt", "client.key")))
        ),
    );
    let d = Daemon::start(&text, &[]).await;
    let ok = eventually(Duration::from_secs(30), || {
        let url = d.url("/readyz");
        async move { matches!(reqwest::get(&url).await, Ok(r) if r.status() == 200) }
    })
    .await;
    assert!(ok, "log:\n{}", d.log());
}

#[tokio::test]
async fn startup_refuses_bad_tls_files_naming_the_field() {
    let pki = Pki::generate();
    let prefix = common::unique_prefix("tls-files");
    // No etcd needed: the files are checked before any connection.
    let endpoint = "https://127.0.0.1:1";
    let good = tls_section(&pki, "ca.crt", Some(("client.crt", "client.key")));

    let text = config(endpoint, &prefix, "", &good);
    let (code, err) = run_expecting_exit(&text, &["--etcd-certfile", "/nonexistent/client.crt"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("etcd.tls.cert_file") && err.contains("/nonexistent/client.crt"),
        "{err}"
    );

    // A key that belongs to another certificate.
    let text = config(
        endpoint,
        &prefix,
        "",
        &tls_section(&pki, "ca.crt", Some(("client.crt", "server.key"))),
    );
    let (code, err) = run_expecting_exit(&text, &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("etcd.tls.key_file") && err.contains("does not match"),
        "{err}"
    );

    // A CA file that is not PEM.
    std::fs::write(pki.path("garbage.crt"), "not a certificate").unwrap();
    let text = config(endpoint, &prefix, "", &good);
    let garbage = pki.path("garbage.crt").display().to_string();
    let (code, err) = run_expecting_exit(&text, &["--etcd-cafile", &garbage]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("etcd.tls.ca_file") && err.contains("garbage.crt"),
        "{err}"
    );

    // https:// without any CA.
    let text = config(endpoint, &prefix, "", "");
    let (code, err) = run_expecting_exit(&text, &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("etcd.tls.ca_file"), "{err}");
}

/// kube-apiserver's way: `https://` endpoints in the file, every TLS file
/// on the command line (`--etcd-cafile`, `--etcd-certfile`,
/// `--etcd-keyfile`). The file alone is not valid; the flags complete it, so
/// the daemon serves over mTLS, and a missing CA file given by flag is named
/// in the exit-2 message (not "https:// endpoints need [etcd.tls] ca_file").
#[tokio::test]
async fn tls_flags_complete_a_file_with_https_endpoints() {
    let pki = Pki::generate();
    let etcd = tls_etcd(&pki).await;
    let prefix = common::unique_prefix("tls-flags");
    let text = config(&etcd.endpoint(), &prefix, "", "");
    let (ca, cert, key) = (
        pki.path("ca.crt").display().to_string(),
        pki.path("client.crt").display().to_string(),
        pki.path("client.key").display().to_string(),
    );
    let d = Daemon::start(
        &text,
        &[
            "--etcd-cafile",
            &ca,
            "--etcd-certfile",
            &cert,
            "--etcd-keyfile",
            &key,
        ],
    )
    .await;
    d.wait_ready().await;
    let http = reqwest::Client::new();
    let r = http
        .post(d.url("/api/v1/namespaces/default/pods"))
        .json(&pod("p1"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        201,
        "{}\nlog:\n{}",
        r.text().await.unwrap(),
        d.log()
    );
    drop(d);

    let missing = pki.dir().join("missing-ca.crt").display().to_string();
    let (code, err) = run_expecting_exit(
        &text,
        &[
            "--etcd-cafile",
            &missing,
            "--etcd-certfile",
            &cert,
            "--etcd-keyfile",
            &key,
        ],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("etcd.tls.ca_file") && err.contains("missing-ca.crt"),
        "{err}"
    );
    assert!(!err.contains("need [etcd.tls]"), "{err}");
}

// ---- encryption at rest ------------------------------------------------------

#[derive(serde::Deserialize)]
struct Vector {
    provider: String,
    key_name: String,
    secret: String,
    etcd_key: String,
    stored_b64: String,
}

fn vectors() -> Vec<Vector> {
    #[derive(serde::Deserialize)]
    struct Vectors {
        vectors: Vec<Vector>,
    }
    let text = include_str!("fixtures/encryption/vectors.json");
    serde_json::from_str::<Vectors>(text).unwrap().vectors
}

fn b64(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}

#[tokio::test]
async fn daemon_encrypts_secrets_like_kube_apiserver() {
    let v = vectors()
        .into_iter()
        .find(|v| {
            v.provider == "aesgcm"
                && v.key_name == "key1"
                && v.etcd_key == "/registry/secrets/default/db"
        })
        .unwrap();
    // A private etcd so the daemon can use kube-apiserver's own prefix and
    // read the Python-made value at its real key (the key is the AAD).
    let etcd = PrivateEtcd::start().await.expect("etcd");
    let mut raw = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .unwrap();
    raw.put(v.etcd_key.as_str(), b64(&v.stored_b64), None)
        .await
        .unwrap();
    // Encrypted with a key this daemon does not have.
    let mut junk = b"k8s:enc:aesgcm:v1:key9:".to_vec();
    junk.extend_from_slice(&[0x5a; 48]);
    raw.put("/registry/secrets/default/bad", junk.clone(), None)
        .await
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let enc = dir.path().join("encryption.yaml");
    std::fs::write(
        &enc,
        format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n  - resources:\n      - secrets\n    providers:\n      - aesgcm:\n          keys:\n            - name: key1\n              secret: {}\n      - identity: {{}}\n",
            v.secret
        ),
    )
    .unwrap();
    let text = config(&etcd.endpoint(), "/registry", "", "");
    let d = Daemon::start(
        &text,
        &["--encryption-provider-config", &enc.display().to_string()],
    )
    .await;
    let http = reqwest::Client::new();
    let ready_url = d.url("/readyz");
    assert!(
        eventually(Duration::from_secs(30), || {
            let (http, url) = (http.clone(), ready_url.clone());
            async move { matches!(http.get(&url).send().await, Ok(r) if r.status() == 200) }
        })
        .await,
        "ready; log:\n{}",
        d.log()
    );

    // The value made outside (as kube-apiserver would) is served decrypted.
    let got: Value = http
        .get(d.url("/api/v1/namespaces/default/secrets/db"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got["data"]["password"], "aHVudGVyMg==", "{got}");

    // A write is stored encrypted with the first provider, bound to its key.
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "created", "namespace": "default"}, "data": {"token": "c2VjcmV0"}});
    let r = http
        .post(d.url("/api/v1/namespaces/default/secrets"))
        .json(&secret)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let key = "/registry/secrets/default/created";
    let stored = raw.get(key, None).await.unwrap().kvs()[0].value().to_vec();
    let prefix = b"k8s:enc:aesgcm:v1:key1:";
    assert!(
        stored.starts_with(prefix),
        "{:?}",
        String::from_utf8_lossy(&stored[..30])
    );
    assert!(!String::from_utf8_lossy(&stored).contains("c2VjcmV0"));
    // Decrypt with the cipher directly: nonce(12) + sealed, AAD = etcd key.
    let cipher = aes_gcm::Aes256Gcm::new_from_slice(&b64(&v.secret)).unwrap();
    let body = &stored[prefix.len()..];
    let plain = cipher
        .decrypt(
            body[..12].into(),
            Payload {
                msg: &body[12..],
                aad: key.as_bytes(),
            },
        )
        .expect("kube-apiserver layout decrypts");
    let plain: Value = serde_json::from_slice(&plain).unwrap();
    assert_eq!(plain["data"]["token"], "c2VjcmV0");
    let got: Value = http
        .get(d.url("/api/v1/namespaces/default/secrets/created"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got["data"]["token"], "c2VjcmV0");

    // An unreadable value arriving by watch is skipped too; the rest go on.
    raw.put("/registry/secrets/default/bad2", junk.clone(), None)
        .await
        .unwrap();
    let r = http
        .post(d.url("/api/v1/namespaces/default/secrets"))
        .json(&json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "after", "namespace": "default"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let list_url = d.url("/api/v1/namespaces/default/secrets");
    let names = || async {
        let list: Value = http
            .get(&list_url)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let mut names: Vec<String> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        names.sort();
        names
    };
    assert!(
        eventually(Duration::from_secs(10), || async {
            names().await == ["after", "created", "db"]
        })
        .await,
        "got {:?}",
        names().await
    );
    assert!(
        metric(
            &d,
            "watchcache_transformation_failures_total{reason=\"no_matching_provider\",resource=\"secrets\"}"
        )
        .await
            >= 2.0
    );
    assert!(
        metric(
            &d,
            "watchcache_transformation_operations_total{resource=\"secrets\",result=\"ok\",transformation_type=\"to_storage\"}"
        )
        .await
            >= 2.0
    );
    // Logged with the key and the reason, never the data.
    let log = d.log();
    assert!(log.contains("/registry/secrets/default/bad"), "{log}");
    assert!(log.contains("k8s:enc:aesgcm:v1:key9"), "{log}");
    assert!(!log.contains("ZZZZ"), "{log}");
}

#[test]
fn malformed_encryption_config_stops_startup() {
    let dir = tempfile::tempdir().unwrap();
    let enc = dir.path().join("encryption.yaml");
    std::fs::write(
        &enc,
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n  - resources: [secrets]\n    providers:\n      - aesgmc:\n          keys:\n            - name: k\n              secret: AAAA\n",
    )
    .unwrap();
    let text = config("http://127.0.0.1:1", "/registry", "", "");
    let (code, err) = run_expecting_exit(
        &text,
        &["--encryption-provider-config", &enc.display().to_string()],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("encryption.yaml") && err.contains("aesgmc"),
        "{err}"
    );

    // Through the TOML field, a key of the wrong size names its path.
    std::fs::write(
        &enc,
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n  - resources: [secrets]\n    providers:\n      - aesgcm:\n          keys:\n            - name: k\n              secret: AAAA\n",
    )
    .unwrap();
    let text = config(
        "http://127.0.0.1:1",
        "/registry",
        &format!("encryption_provider_config = \"{}\"", enc.display()),
        "",
    );
    let (code, err) = run_expecting_exit(&text, &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("resources[0].providers[0].aesgcm.keys[0].secret"),
        "{err}"
    );

    let (code, err) = run_expecting_exit(
        &text.replace(&enc.display().to_string(), "/nonexistent/enc.yaml"),
        &[],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("/nonexistent/enc.yaml"), "{err}");
}

// ---- a kubeadm-like cluster --------------------------------------------------

/// kubeadm's file layout under a temp dir standing in for /etc/kubernetes.
fn kubeadm_tree(pki: &Pki) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let etc = root.path().join("pki");
    std::fs::create_dir_all(etc.join("etcd")).unwrap();
    for (from, to) in [
        ("ca.crt", "etcd/ca.crt"),
        ("client.crt", "apiserver-etcd-client.crt"),
        ("client.key", "apiserver-etcd-client.key"),
    ] {
        std::fs::copy(pki.path(from), etc.join(to)).unwrap();
    }
    root
}

fn kubectl(kubeconfig: &std::path::Path, home: &std::path::Path) -> Command {
    let bin = watchcache::etcd_server::find_kubectl_binary()
        .or_else(|| Some("/usr/local/bin/kubectl".into()))
        .filter(|p| p.is_file())
        .expect("kubectl (tools/ or PATH)");
    let mut c = Command::new(bin);
    c.env_clear()
        .env("HOME", home)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--request-timeout=20s");
    c
}

fn run_kubectl(kubeconfig: &std::path::Path, home: &std::path::Path, args: &[&str]) -> String {
    let out = kubectl(kubeconfig, home).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// config/kubernetes.toml as shipped, pointed at a TLS etcd with client-cert
/// auth through kubeadm's paths: objects written at kube-apiserver's keys
/// (JSON storage encoding, a Secret encrypted by a Python-made aesgcm value,
/// a custom resource) are served to kubectl.
#[tokio::test]
async fn kubeadm_layout_through_kubectl() {
    let pki = Pki::generate();
    let etcd = tls_etcd(&pki).await;
    let root = kubeadm_tree(&pki);
    let pki_dir = root.path().join("pki").display().to_string();

    let v = vectors()
        .into_iter()
        .find(|v| v.provider == "aesgcm" && v.key_name == "key1" && v.etcd_key.ends_with("/db"))
        .unwrap();
    let enc = root.path().join("encryption-config.yaml");
    std::fs::write(
        &enc,
        format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n  - resources: [secrets]\n    providers:\n      - aesgcm:\n          keys:\n            - name: key1\n              secret: {}\n      - identity: {{}}\n",
            v.secret
        ),
    )
    .unwrap();

    // Write as kube-apiserver would, through the same mTLS etcd.
    let s = Storage::connect(&EtcdConfig {
        tls: Some(EtcdTlsConfig {
            ca_file: Some(pki.path("ca.crt")),
            cert_file: Some(pki.path("client.crt")),
            key_file: Some(pki.path("client.key")),
            server_name: None,
        }),
        ..common::etcd_config(&etcd.endpoint(), "/registry")
    })
    .await
    .unwrap();
    let put = |key: &'static str, value: Vec<u8>| {
        let s = s.clone();
        async move {
            s.create(key, value.into(), &WriteOptions::default())
                .await
                .unwrap_or_else(|e| panic!("{key}: {e}"));
        }
    };
    let obj = |kind: &str, api: &str, name: &str, extra: Value| {
        let mut o = json!({"kind": kind, "apiVersion": api, "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "creationTimestamp": "2026-01-01T00:00:00Z"}});
        if let (Some(o), Some(e)) = (o.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                o.insert(k.clone(), v.clone());
            }
        }
        serde_json::to_vec(&o).unwrap()
    };
    put("/registry/secrets/default/db", b64(&v.stored_b64)).await;
    put(
        "/registry/pods/default/p1",
        obj("Pod", "v1", "p1", json!({"spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "nginx"}]}, "status": {"phase": "Running"}})),
    )
    .await;
    put(
        "/registry/services/specs/default/s1",
        obj("Service", "v1", "s1", json!({"spec": {"type": "ClusterIP", "clusterIP": "10.0.0.10", "ports": [{"port": 80}]}})),
    )
    .await;
    put(
        "/registry/deployments/default/d1",
        obj(
            "Deployment",
            "apps/v1",
            "d1",
            json!({"spec": {"replicas": 1}}),
        ),
    )
    .await;
    put(
        "/registry/example.com/widgets/default/w1",
        obj(
            "Widget",
            "example.com/v1",
            "w1",
            json!({"spec": {"size": 3}}),
        ),
    )
    .await;

    let shipped = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/kubernetes.toml"),
    )
    .unwrap();
    let text = shipped
        .replace("https://127.0.0.1:2379", &etcd.endpoint())
        .replace("/etc/kubernetes/pki", &pki_dir)
        + "\n[[resources]]\ngroup = \"example.com\"\nversion = \"v1\"\nkind = \"Widget\"\nplural = \"widgets\"\nnamespaced = true\n";
    let d = Daemon::start(
        &text,
        &["--encryption-provider-config", &enc.display().to_string()],
    )
    .await;
    let ready = eventually(Duration::from_secs(60), || {
        let url = d.url("/readyz");
        async move { matches!(reqwest::get(&url).await, Ok(r) if r.status() == 200) }
    })
    .await;
    assert!(ready, "log:\n{}", d.log());

    let home = tempfile::tempdir().unwrap();
    let kubeconfig = home.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: wc\n  cluster:\n    server: {}\ncontexts:\n- name: wc\n  context:\n    cluster: wc\n    user: wc\ncurrent-context: wc\nusers:\n- name: wc\n  user: {{}}\n",
            d.url("")
        ),
    )
    .unwrap();
    let k = |args: &[&str]| run_kubectl(&kubeconfig, home.path(), args);

    let pods = k(&["get", "pods", "-A"]);
    assert!(pods.contains("p1") && pods.contains("default"), "{pods}");
    let secret = k(&["get", "secret", "db", "-n", "default", "-o", "yaml"]);
    assert!(secret.contains("password: aHVudGVyMg=="), "{secret}");
    let svc = k(&["get", "services", "-n", "default", "-o", "name"]);
    assert!(svc.contains("service/s1"), "{svc}");
    let dep = k(&["get", "deployments.apps", "-A", "-o", "name"]);
    assert!(dep.contains("deployment.apps/d1"), "{dep}");
    let w = k(&["get", "widgets", "-n", "default", "-o", "name"]);
    assert!(w.contains("w1"), "{w}");

    // resourceVersion is etcd's mod revision.
    let rv = k(&[
        "get",
        "pod",
        "p1",
        "-n",
        "default",
        "-o",
        "jsonpath={.metadata.resourceVersion}",
    ]);
    let stored = s.get("/registry/pods/default/p1", 0).await.unwrap();
    assert_eq!(rv.trim(), stored.mod_revision.to_string());

    // A watch sees a pod written afterwards.
    let mut watch = kubectl(&kubeconfig, home.path())
        .args(["get", "pods", "-A", "-w", "-o", "name"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = watch.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    // The initial list first, then the new pod.
    let first = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("initial list line");
    assert!(first.contains("p1"), "{first}");
    put(
        "/registry/pods/default/p2",
        obj("Pod", "v1", "p2", json!({"spec": {"nodeName": "n2"}})),
    )
    .await;
    let seen = (0..10).any(|_| {
        rx.recv_timeout(Duration::from_secs(10))
            .is_ok_and(|l| l.contains("p2"))
    });
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(seen, "kubectl -w saw the new pod; log:\n{}", d.log());
}
