//! Secure serving against real clients: TLS (certificates made here with
//! rcgen), client-certificate, token and anonymous authentication, RBAC from
//! policy files, `kubectl auth can-i` / `whoami`, audit lines and metrics.
mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use common::kubectl::{KubeUser, Kubectl};
use common::pki::{CertFiles, TestCa};
use common::server::{TestServer, pod};
use common::tls::{self, ClientAuth};
use watchcache::config::{AuthorizationMode, TlsConfig};

const TOKENS: &str =
    "bob-token,bob,1002,\"ops,dev\"\nprom-token,prometheus,1003\ncarol-token,carol,1004\n";

const POLICY: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: pod-reader, namespace: team-a}
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: alice-reads-pods, namespace: team-a}
subjects:
- {kind: User, name: alice, apiGroup: rbac.authorization.k8s.io}
roleRef: {kind: Role, name: pod-reader, apiGroup: rbac.authorization.k8s.io}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: ops}
rules:
- apiGroups: [""]
  resources: [nodes]
  resourceNames: [node-1]
  verbs: [get, update, patch, list, watch]
- apiGroups: [example.com]
  resources: ["*"]
  verbs: ["*"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: ops}
subjects:
- {kind: Group, name: ops, apiGroup: rbac.authorization.k8s.io}
roleRef: {kind: ClusterRole, name: ops, apiGroup: rbac.authorization.k8s.io}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: metrics-reader}
rules:
- nonResourceURLs: [/metrics]
  verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: prometheus}
subjects:
- {kind: User, name: prometheus, apiGroup: rbac.authorization.k8s.io}
roleRef: {kind: ClusterRole, name: metrics-reader, apiGroup: rbac.authorization.k8s.io}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: impersonate-alice}
rules:
- apiGroups: [""]
  resources: [users]
  resourceNames: [alice]
  verbs: [impersonate]
- apiGroups: [""]
  resources: [groups]
  resourceNames: [dev]
  verbs: [impersonate]
- apiGroups: [authentication.k8s.io]
  resources: [userextras/scopes]
  verbs: [impersonate]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: carol-impersonates-alice}
subjects:
- {kind: User, name: carol, apiGroup: rbac.authorization.k8s.io}
roleRef: {kind: ClusterRole, name: impersonate-alice, apiGroup: rbac.authorization.k8s.io}
"#;

/// A TLS server with client certificates and tokens, plus the PKI.
struct Secure {
    ts: TestServer,
    dir: tempfile::TempDir,
    ca: TestCa,
    ca_path: PathBuf,
    serving: CertFiles,
    admin: CertFiles,
    alice: CertFiles,
}

struct Options {
    rbac: bool,
    anonymous: Option<bool>,
    min_version: &'static str,
}

async fn start_secure(name: &str, opts: Options) -> Secure {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("watchcache-test-ca");
    let ca_path = ca.write(dir.path(), "ca.crt");
    let serving = ca.server_cert(dir.path(), "serving");
    let admin = ca.client_cert(dir.path(), "admin", Some("system:masters"), false);
    let alice = ca.client_cert(dir.path(), "alice", Some("dev"), false);
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, TOKENS).expect("tokens");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, POLICY).expect("policy");
    let (ca2, serving2) = (ca_path.clone(), serving.clone());
    let ts = TestServer::start(name, move |cfg| {
        cfg.server.tls = Some(TlsConfig {
            cert_file: serving2.cert,
            private_key_file: serving2.key,
            min_version: opts.min_version.into(),
        });
        cfg.server.authentication.client_ca_file = Some(ca2);
        cfg.server.authentication.token_auth_file = Some(tokens);
        cfg.server.authentication.anonymous = opts.anonymous;
        if opts.rbac {
            cfg.server.authorization.mode = AuthorizationMode::Rbac;
            cfg.server.authorization.policy_files = vec![policy];
        }
    })
    .await;
    Secure {
        ts,
        dir,
        ca,
        ca_path,
        serving,
        admin,
        alice,
    }
}

impl Secure {
    fn server(&self) -> String {
        format!("https://{}", self.ts.addr)
    }

    fn kubectl(&self, user: KubeUser<'_>) -> Kubectl {
        Kubectl::new(&self.server(), Some(&self.ca_path), user)
    }

    async fn req(
        &self,
        auth: &ClientAuth,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> (u16, String) {
        tls::request(self.ts.addr, &self.ca.cert_pem, auth, method, path, body).await
    }
}

fn json_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

fn node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
}

fn widget(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget",
           "metadata": {"name": name, "namespace": ns}, "spec": {"size": 1}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_with_certificates_tokens_and_rbac() {
    let s = start_secure(
        "auth-rbac",
        Options {
            rbac: true,
            anonymous: Some(true),
            min_version: "VersionTLS12",
        },
    )
    .await;
    // Fixtures, as system:masters (the bootstrap cluster-admin binding).
    let admin = ClientAuth::cert(&s.admin);
    for (path, body) in [
        ("/api/v1/namespaces/team-a/pods", pod("team-a", "a1")),
        ("/api/v1/namespaces/team-b/pods", pod("team-b", "b1")),
        ("/api/v1/nodes", node("node-1")),
        ("/api/v1/nodes", node("node-2")),
    ] {
        let (code, body) = s.req(&admin, "POST", path, Some(&body)).await;
        assert_eq!(code, 201, "{path}: {body}");
    }
    let k_admin = s.kubectl(KubeUser::Cert(&s.admin));
    let who = k_admin.run(&["auth", "whoami"]).await;
    assert!(
        who.contains("admin")
            && who.contains("system:masters")
            && who.contains("system:authenticated"),
        "{who}"
    );

    // alice: client certificate, a RoleBinding in team-a only.
    let k_alice = s.kubectl(KubeUser::Cert(&s.alice));
    let who = k_alice.run(&["auth", "whoami", "-o", "json"]).await;
    let who = json_of(&who);
    assert_eq!(who["status"]["userInfo"]["username"], "alice");
    assert_eq!(
        who["status"]["userInfo"]["groups"],
        json!(["dev", "system:authenticated"])
    );
    let out = k_alice
        .run(&["get", "pods", "-n", "team-a", "-o", "name"])
        .await;
    assert_eq!(out.trim(), "pod/a1");
    k_alice.run(&["get", "pod", "a1", "-n", "team-a"]).await;
    let err = k_alice.fail(&["get", "pods", "-n", "team-b"]).await;
    assert!(
        err.contains(r#"pods is forbidden: User "alice" cannot list resource "pods" in API group "" in the namespace "team-b""#),
        "{err}"
    );
    let err = k_alice.fail(&["get", "pods", "-A"]).await;
    assert!(
        err.contains(r#"pods is forbidden: User "alice" cannot list resource "pods" in API group "" at the cluster scope"#),
        "{err}"
    );
    let err = k_alice.fail(&["delete", "pod", "a1", "-n", "team-a"]).await;
    assert!(
        err.contains(r#"pods "a1" is forbidden: User "alice" cannot delete resource "pods" in API group "" in the namespace "team-a""#),
        "{err}"
    );
    let manifest = k_alice.write_file("p.json", &pod("team-a", "a2").to_string());
    let err = k_alice.fail(&["create", "-f", &manifest]).await;
    assert!(
        err.contains(r#"pods is forbidden: User "alice" cannot create resource "pods" in API group "" in the namespace "team-a""#),
        "{err}"
    );
    // Watch: allowed in team-a, forbidden elsewhere.
    let alice = ClientAuth::cert(&s.alice);
    let (code, body) = s
        .req(
            &alice,
            "GET",
            "/api/v1/namespaces/team-a/pods?watch=true&timeoutSeconds=1",
            None,
        )
        .await;
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains("\"ADDED\"") && body.contains("\"a1\""),
        "{body}"
    );
    let (code, body) = s
        .req(
            &alice,
            "GET",
            "/api/v1/namespaces/team-b/pods?watch=true&timeoutSeconds=1",
            None,
        )
        .await;
    assert_eq!(code, 403, "{body}");
    let st = json_of(&body);
    assert_eq!(st["reason"], "Forbidden");
    assert_eq!(
        st["message"],
        r#"pods is forbidden: User "alice" cannot watch resource "pods" in API group "" in the namespace "team-b""#
    );
    // can-i
    assert_eq!(
        k_alice
            .run(&["auth", "can-i", "list", "pods", "-n", "team-a"])
            .await
            .trim(),
        "yes"
    );
    let no = k_alice
        .output(&["auth", "can-i", "list", "pods", "-n", "team-b"])
        .await;
    assert!(
        !no.success && no.stdout.trim() == "no",
        "{} {}",
        no.stdout,
        no.stderr
    );

    // can-i --list: SelfSubjectRulesReview.
    let list = k_alice
        .run(&["auth", "can-i", "--list", "-n", "team-a"])
        .await;
    assert!(
        list.lines()
            .any(|l| l.starts_with("pods ") && l.contains("[get list watch]")),
        "{list}"
    );
    let list = k_alice
        .run(&["auth", "can-i", "--list", "-n", "team-b"])
        .await;
    assert!(!list.lines().any(|l| l.starts_with("pods ")), "{list}");
    assert!(
        list.contains("selfsubjectaccessreviews.authorization.k8s.io"),
        "{list}"
    );

    // bob: token, group ops: node-1 only (resourceNames), every widget verb.
    let k_bob = s.kubectl(KubeUser::Token("bob-token"));
    let who = k_bob.run(&["auth", "whoami"]).await;
    assert!(
        who.contains("bob") && who.contains("ops") && who.contains("1002"),
        "{who}"
    );
    k_bob.run(&["get", "node", "node-1"]).await;
    let err = k_bob.fail(&["get", "node", "node-2"]).await;
    assert!(
        err.contains(r#"nodes "node-2" is forbidden: User "bob" cannot get resource "nodes" in API group "" at the cluster scope"#),
        "{err}"
    );
    // patch and update on node-1 only.
    let patch = r#"{"metadata":{"labels":{"team":"ops"}}}"#;
    k_bob
        .run(&["patch", "node", "node-1", "--type=merge", "-p", patch])
        .await;
    // (kubectl patch and replace read first; send them directly to see the
    // patch and update themselves denied.)
    let bob = ClientAuth::token("bob-token");
    let (code, body) = tls::request_with(
        s.ts.addr,
        &s.ca.cert_pem,
        &bob,
        "PATCH",
        "/api/v1/nodes/node-2",
        Some(("application/merge-patch+json", patch.to_string())),
    )
    .await;
    assert_eq!(code, 403, "{body}");
    assert_eq!(
        json_of(&body)["message"],
        r#"nodes "node-2" is forbidden: User "bob" cannot patch resource "nodes" in API group "" at the cluster scope"#
    );
    let node1 = k_bob.run(&["get", "node", "node-1", "-o", "json"]).await;
    let file = k_bob.write_file("node-1.json", &node1);
    k_bob.run(&["replace", "-f", &file]).await;
    let (code, body) = s.req(&admin, "GET", "/api/v1/nodes/node-2", None).await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = s
        .req(&bob, "PUT", "/api/v1/nodes/node-2", Some(&json_of(&body)))
        .await;
    assert_eq!(code, 403, "{body}");
    assert_eq!(
        json_of(&body)["message"],
        r#"nodes "node-2" is forbidden: User "bob" cannot update resource "nodes" in API group "" at the cluster scope"#
    );
    let err = k_bob.fail(&["get", "nodes"]).await;
    assert!(err.contains("cannot list resource \"nodes\""), "{err}");
    // A list or watch limited to node-1 by its field selector is a request
    // for node-1 (resourceNames), as kube-apiserver authorizes it: what
    // `kubectl get node node-1 -w` and one-object informers send.
    let one = "/api/v1/nodes?fieldSelector=metadata.name%3Dnode-1";
    let (code, body) = s.req(&bob, "GET", one, None).await;
    assert_eq!(code, 200, "{body}");
    let items = json_of(&body)["items"].clone();
    assert_eq!(items.as_array().map(Vec::len), Some(1), "{body}");
    assert_eq!(items[0]["metadata"]["name"], "node-1");
    let (code, body) = s
        .req(
            &bob,
            "GET",
            &format!("{one}&watch=1&timeoutSeconds=1"),
            None,
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let first = json_of(body.lines().next().unwrap_or_default());
    assert_eq!(first["type"], "ADDED", "{body}");
    assert_eq!(first["object"]["metadata"]["name"], "node-1");
    let (code, body) = s
        .req(
            &bob,
            "GET",
            "/api/v1/nodes?fieldSelector=metadata.name%3Dnode-2",
            None,
        )
        .await;
    assert_eq!(code, 403, "{body}");
    let manifest = k_bob.write_file("w.json", &widget("team-c", "w1").to_string());
    k_bob.run(&["create", "-f", &manifest]).await;
    k_bob
        .run(&["delete", "widgets.example.com", "w1", "-n", "team-c"])
        .await;
    assert_eq!(
        k_bob
            .run(&["auth", "can-i", "get", "nodes/node-1"])
            .await
            .trim(),
        "yes"
    );
    let no = k_bob
        .output(&["auth", "can-i", "get", "nodes/node-2"])
        .await;
    assert_eq!(no.stdout.trim(), "no", "{}", no.stderr);
    let err = k_bob.fail(&["delete", "pod", "a1", "-n", "team-a"]).await;
    assert!(err.contains("forbidden"), "{err}");

    // Anonymous: health and /version yes, resources and /metrics no.
    let k_anon = s.kubectl(KubeUser::Anonymous);
    assert_eq!(k_anon.run(&["get", "--raw", "/healthz"]).await.trim(), "ok");
    k_anon.run(&["get", "--raw", "/readyz"]).await;
    k_anon.run(&["get", "--raw", "/version"]).await;
    let err = k_anon
        .fail(&["get", "--raw", "/api/v1/namespaces/default/pods"])
        .await;
    assert!(err.contains("Forbidden"), "{err}");
    let (code, body) = s
        .req(
            &ClientAuth::anonymous(),
            "GET",
            "/api/v1/namespaces/default/pods",
            None,
        )
        .await;
    assert_eq!(code, 403);
    assert_eq!(
        json_of(&body)["message"],
        r#"pods is forbidden: User "system:anonymous" cannot list resource "pods" in API group "" in the namespace "default""#
    );
    let (code, body) = s
        .req(&ClientAuth::anonymous(), "GET", "/metrics", None)
        .await;
    assert_eq!(code, 403);
    assert_eq!(
        json_of(&body)["message"],
        r#"forbidden: User "system:anonymous" cannot get path "/metrics""#
    );
    let no = k_anon.output(&["auth", "can-i", "list", "pods"]).await;
    assert!(!no.success, "anonymous may not even ask: {}", no.stdout);

    // Wrong credentials: 401 with no detail, never anonymous.
    let (code, body) = s
        .req(
            &ClientAuth::token("wrong"),
            "GET",
            "/api/v1/namespaces/default/pods",
            None,
        )
        .await;
    assert_eq!(code, 401, "{body}");
    let st = json_of(&body);
    assert_eq!(
        (st["reason"].as_str(), st["message"].as_str()),
        (Some("Unauthorized"), Some("Unauthorized"))
    );
    let err = s
        .kubectl(KubeUser::Token("wrong"))
        .fail(&["get", "--raw", "/healthz"])
        .await;
    assert!(err.contains("Unauthorized"), "{err}");
    // An expired certificate, and one from a CA the daemon does not trust
    // (with a group that would allow everything): both unauthenticated.
    let expired = s.ca.client_cert(s.dir.path(), "alice", Some("dev"), true);
    let other_ca = TestCa::new("someone-else");
    let foreign = other_ca.client_cert(s.dir.path(), "mallory", Some("system:masters"), false);
    for (what, cert) in [("expired", &expired), ("foreign", &foreign)] {
        let (code, _) = s
            .req(
                &ClientAuth::cert(cert),
                "GET",
                "/api/v1/namespaces/team-a/pods",
                None,
            )
            .await;
        assert_eq!(code, 401, "{what}");
        let err = s
            .kubectl(KubeUser::Cert(cert))
            .fail(&["get", "pods", "-n", "team-a"])
            .await;
        assert!(
            err.contains("Unauthorized") || err.contains("must be logged in"),
            "{what}: {err}"
        );
    }

    // Prometheus scrapes /metrics with its token; the counters are there.
    let k_prom = s.kubectl(KubeUser::Token("prom-token"));
    let metrics = k_prom.run(&["get", "--raw", "/metrics"]).await;
    for line in [
        "watchcache_authentication_attempts_total{result=\"failure\"}",
        "watchcache_authentication_attempts_total{result=\"success\"}",
        "watchcache_authentication_attempts_total{result=\"anonymous\"}",
        "watchcache_authorization_decisions_total{decision=\"denied\"}",
        "watchcache_authorization_decisions_total{decision=\"allowed\"}",
    ] {
        assert!(metrics.contains(line), "{line} in /metrics");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_port_answers_plain_http_negotiates_h2_and_enforces_min_version() {
    let s = start_secure(
        "auth-tls",
        Options {
            rbac: false,
            anonymous: None,
            min_version: "VersionTLS13",
        },
    )
    .await;
    // Plain HTTP to the TLS port: Go's (kube-apiserver's) answer.
    let mut tcp = tokio::net::TcpStream::connect(s.ts.addr).await.unwrap();
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_string(&mut answer))
        .await
        .expect("answer in time")
        .expect("read");
    assert!(answer.starts_with("HTTP/1.0 400 Bad Request"), "{answer}");
    assert!(
        answer.contains("Client sent an HTTP request to an HTTPS server."),
        "{answer}"
    );
    let err = Kubectl::new(&format!("http://{}", s.ts.addr), None, KubeUser::Anonymous)
        .fail(&["get", "--raw", "/healthz"])
        .await;
    assert!(
        err.contains("BadRequest") || err.contains("HTTPS server"),
        "{err}"
    );

    // ALPN: h2 preferred, http/1.1 offered.
    let h2 = tls::client_config(
        &s.ca.cert_pem,
        None,
        &[b"h2", b"http/1.1"],
        rustls::DEFAULT_VERSIONS,
    );
    let conn = tls::connect(s.ts.addr, h2).await.expect("handshake");
    assert_eq!(conn.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let h1 = tls::client_config(
        &s.ca.cert_pem,
        None,
        &[b"http/1.1"],
        rustls::DEFAULT_VERSIONS,
    );
    let conn = tls::connect(s.ts.addr, h1).await.expect("handshake");
    assert_eq!(conn.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));

    // --tls-min-version VersionTLS13: a TLS 1.2-only client is refused.
    let tls12 = tls::client_config(&s.ca.cert_pem, None, &[], &[&rustls::version::TLS12]);
    assert!(tls::connect(s.ts.addr, tls12).await.is_err());

    // AlwaysAllow with authenticators and anonymous off (the default when
    // any authenticator is set): credentials are required, except for the
    // health probes.
    let k_anon = s.kubectl(KubeUser::Anonymous);
    assert_eq!(k_anon.run(&["get", "--raw", "/livez"]).await.trim(), "ok");
    let err = k_anon
        .fail(&["get", "--raw", "/api/v1/namespaces/default/pods"])
        .await;
    assert!(err.contains("Unauthorized"), "{err}");
    let k_alice = s.kubectl(KubeUser::Cert(&s.alice));
    assert_eq!(
        k_alice
            .run(&["auth", "can-i", "delete", "pods"])
            .await
            .trim(),
        "yes"
    );
    k_alice.run(&["get", "pods", "-A"]).await;
}

/// The DER of the certificate the server presents now.
async fn served_cert(s: &Secure) -> Vec<u8> {
    let config = tls::client_config(&s.ca.cert_pem, None, &[], rustls::DEFAULT_VERSIONS);
    let conn = tls::connect(s.ts.addr, config).await.expect("handshake");
    conn.get_ref()
        .1
        .peer_certificates()
        .expect("server certificate")[0]
        .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serving_certificate_is_reloaded_when_its_files_change() {
    let s = start_secure(
        "auth-reload",
        Options {
            rbac: false,
            anonymous: None,
            min_version: "VersionTLS12",
        },
    )
    .await;
    let before = served_cert(&s).await;
    // A new pair in a scratch dir, moved over the served files.
    let scratch = tempfile::tempdir().unwrap();
    let fresh = s.ca.server_cert(scratch.path(), "serving");
    std::fs::copy(&fresh.key, &s.serving.key).unwrap();
    std::fs::copy(&fresh.cert, &s.serving.cert).unwrap();
    let fresh_der = served_der(&fresh.cert);
    assert_ne!(before, fresh_der);
    // The files are checked every few seconds: poll new connections.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut now = before.clone();
    while now == before && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        now = served_cert(&s).await;
    }
    assert_ne!(now, before, "the new certificate was not picked up");
    assert_eq!(now, fresh_der);
    // Connections keep working with it.
    let k = s.kubectl(KubeUser::Cert(&s.alice));
    k.run(&["get", "pods", "-A"]).await;
}

fn served_der(cert: &Path) -> Vec<u8> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    CertificateDer::from_pem_file(cert).unwrap().to_vec()
}

/// The daemon with the kube-apiserver flags on plain HTTP: audit lines for
/// writes and denials, without bodies or tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_flags_and_audit_lines() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, TOKENS).unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, POLICY).unwrap();
    let prefix = common::unique_prefix("auth-audit");
    let text = common::daemon_config(common::etcd(), &prefix, "");
    let d = common::Daemon::start_env(
        &text,
        &[
            "--token-auth-file",
            tokens.to_str().unwrap(),
            "--authorization-mode",
            "RBAC",
            "--rbac-policy-file",
            policy.to_str().unwrap(),
            "--log-format",
            "json",
        ],
        &[("RUST_LOG", "warn,audit=info")],
    )
    .await;
    d.wait_ready().await;
    let http = reqwest::Client::new();
    let secret_body = widget("team-c", "w-audit")
        .to_string()
        .replace("\"size\":1", "\"size\":\"body-marker\"");
    let r = http
        .post(d.url("/apis/example.com/v1/namespaces/team-c/widgets"))
        .bearer_auth("bob-token")
        .header("content-type", "application/json")
        .body(secret_body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let r = http
        .get(d.url("/api/v1/namespaces/team-a/pods"))
        .bearer_auth("bob-token")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.headers().get("connection").is_none(), "no body: kept");
    // Refused with its body unread: the HTTP/1.1 connection ends with the
    // answer, and says so; the next request goes on a new one.
    let r = http
        .post(d.url("/api/v1/namespaces/team-a/pods"))
        .bearer_auth("bob-token")
        .header("content-type", "application/json")
        .body(vec![b' '; 64 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(
        r.headers().get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..])
    );
    let r = http.get(d.url("/api/v1/pods")).send().await.unwrap();
    assert_eq!(
        r.status(),
        401,
        "anonymous is off by default with a token file"
    );
    // carol acting as alice: alice may not create pods; the line names both.
    let r = http
        .post(d.url("/api/v1/namespaces/team-a/pods"))
        .bearer_auth("carol-token")
        .header("impersonate-user", "alice")
        .header("content-type", "application/json")
        .body(pod("team-a", "as-alice").to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    // Reads that are allowed are not audited.
    let r = http
        .get(d.url("/apis/example.com/v1/namespaces/team-c/widgets"))
        .bearer_auth("bob-token")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    let found = common::eventually(Duration::from_secs(10), || {
        let log = d.log();
        async move { log.lines().filter(|l| l.contains("\"audit\"")).count() >= 5 }
    })
    .await;
    let log = d.log();
    assert!(found, "five audit lines:\n{log}");
    let audits: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "audit")
        .collect();
    assert_eq!(audits.len(), 5, "{log}");
    let f = |v: &Value, k: &str| v["fields"][k].clone();
    let create = &audits[0];
    assert_eq!(f(create, "user"), "bob");
    assert_eq!(f(create, "groups"), "ops,dev,system:authenticated");
    assert_eq!(f(create, "verb"), "create");
    assert_eq!(f(create, "resource"), "widgets");
    assert_eq!(f(create, "namespace"), "team-c");
    assert_eq!(f(create, "code"), 201);
    let denied = &audits[1];
    assert_eq!(
        (f(denied, "verb"), f(denied, "code")),
        (json!("list"), json!(403))
    );
    let denied_create = &audits[2];
    assert_eq!(
        (f(denied_create, "verb"), f(denied_create, "code")),
        (json!("create"), json!(403))
    );
    let unauth = &audits[3];
    assert_eq!(
        (f(unauth, "user"), f(unauth, "code")),
        (json!(""), json!(401))
    );
    let impersonated = &audits[4];
    assert_eq!(
        (
            f(impersonated, "user"),
            f(impersonated, "impersonated_user"),
            f(impersonated, "impersonated_groups"),
            f(impersonated, "code")
        ),
        (
            json!("carol"),
            json!("alice"),
            json!("system:authenticated"),
            json!(403)
        )
    );
    assert!(!log.contains("body-marker"), "no bodies in the log");
    assert!(!log.contains("bob-token"), "no credentials in the log");
}

/// The shipped `config/prometheus-secure.yml` with a real Prometheus: it
/// scrapes `/metrics` over TLS with its bearer token under RBAC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_over_tls_with_a_bearer_token() {
    let s = start_secure(
        "auth-prom",
        Options {
            rbac: true,
            anonymous: None,
            min_version: "VersionTLS12",
        },
    )
    .await;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let prometheus = root.join("tools/prometheus/usr/bin/prometheus");
    assert!(prometheus.is_file(), "{} missing", prometheus.display());
    let token = s.dir.path().join("prometheus.token");
    std::fs::write(&token, "prom-token\n").unwrap();
    let port = watchcache::etcd_server::free_port().unwrap();
    let cfg = std::fs::read_to_string(root.join("config/prometheus-secure.yml"))
        .unwrap()
        .replace("127.0.0.1:8080", &s.ts.addr.to_string())
        .replace(
            "/etc/prometheus/watchcache/ca.crt",
            s.ca_path.to_str().unwrap(),
        )
        .replace("/etc/prometheus/watchcache/token", token.to_str().unwrap())
        .replace("scrape_interval: 15s", "scrape_interval: 1s");
    let cfg_path = s.dir.path().join("prometheus.yml");
    std::fs::write(&cfg_path, cfg).unwrap();
    let log_path = s.dir.path().join("prometheus.log");
    let child = std::process::Command::new(&prometheus)
        .arg(format!("--config.file={}", cfg_path.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            s.dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _prom = Kill(child);
    let url = format!("http://127.0.0.1:{port}/api/v1/query?query=up");
    let up = common::eventually(Duration::from_secs(60), || {
        let url = url.clone();
        async move {
            match reqwest::get(&url).await {
                Ok(r) => r
                    .json::<Value>()
                    .await
                    .map(|v| v["data"]["result"][0]["value"][1] == "1")
                    .unwrap_or(false),
                Err(_) => false,
            }
        }
    })
    .await;
    assert!(
        up,
        "prometheus scraped over TLS with its token; log:\n{}",
        std::fs::read_to_string(&log_path).unwrap_or_default()
    );
}

/// The sidecar manifest's embedded config and RBAC policy are valid.
#[test]
fn sidecar_manifest_config_and_policy_parse() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("config/kubernetes-sidecar.yaml")).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    let cm = docs.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    let toml = cm["data"]["watchcache.toml"].as_str().unwrap();
    let cfg = watchcache::config::Config::parse(toml, "sidecar watchcache.toml").unwrap();
    assert!(cfg.server.tls.is_some());
    assert_eq!(cfg.server.authorization.mode, AuthorizationMode::Rbac);
    let rbac = cm["data"]["rbac.yaml"].as_str().unwrap();
    let policy = watchcache::auth::rbac::Policy::parse(&[(rbac, "sidecar rbac.yaml")]).unwrap();
    let prom = watchcache::auth::UserInfo {
        name: "prometheus".into(),
        ..Default::default()
    };
    let metrics = watchcache::auth::Attributes::non_resource("get", "/metrics");
    assert!(policy.authorize(&prom, &metrics).allowed);
    let app = watchcache::auth::UserInfo {
        name: "app".into(),
        ..Default::default()
    };
    assert!(!policy.authorize(&app, &metrics).allowed);
}

/// Bad security settings stop the daemon at start, naming the flag or file.
#[test]
fn bad_security_settings_stop_startup_naming_flag_or_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("watchcache.toml");
    std::fs::write(
        &config,
        common::daemon_config("http://127.0.0.1:1", "/t-auth-cli", ""),
    )
    .unwrap();
    let bad_policy = dir.path().join("bad-policy.yaml");
    std::fs::write(
        &bad_policy,
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: r}\n",
    )
    .unwrap();
    let missing = dir.path().join("missing-tokens.csv");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--authorization-mode".into(), "ABAC".into()],
            "--authorization-mode",
        ),
        (
            vec!["--tls-min-version".into(), "VersionTLS13".into()],
            "--tls-min-version",
        ),
        (
            vec!["--client-ca-file".into(), "/ca.crt".into()],
            "client_ca_file",
        ),
        (
            vec!["--rbac-policy-file".into(), "/p.yaml".into()],
            "policy_files",
        ),
        (
            vec!["--token-auth-file".into(), missing.display().to_string()],
            "missing-tokens.csv",
        ),
        (
            vec![
                "--authorization-mode".into(),
                "RBAC".into(),
                "--rbac-policy-file".into(),
                bad_policy.display().to_string(),
            ],
            "bad-policy.yaml: document 1 (Role \"r\"): metadata.namespace is required",
        ),
    ];
    for (args, want) in cases {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_watchcache"))
            .arg("--config")
            .arg(&config)
            .arg("--listen")
            .arg("127.0.0.1:0")
            .args(&args)
            .env("RUST_LOG", "error")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail: {stderr}");
        assert!(stderr.contains(want), "{args:?}: want {want:?} in {stderr}");
    }
}

/// Impersonation as kube-apiserver does it: carol may impersonate alice
/// (and the group dev, and the extra `scopes`), nothing else. `kubectl
/// --as` runs as alice with alice's rights; `kubectl auth can-i --as` and
/// `auth whoami --as` answer for alice; impersonating anyone else is
/// kube-apiserver's 403, a group without a user its 400; audit lines carry
/// both users; system:masters may impersonate anyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impersonation_as_kube_apiserver_does_it() {
    let s = start_secure(
        "auth-impersonate",
        Options {
            rbac: true,
            anonymous: Some(false),
            min_version: "VersionTLS12",
        },
    )
    .await;
    let admin = ClientAuth::cert(&s.admin);
    for (path, body) in [
        ("/api/v1/namespaces/team-a/pods", pod("team-a", "a1")),
        ("/api/v1/namespaces/team-b/pods", pod("team-b", "b1")),
    ] {
        let (code, body) = s.req(&admin, "POST", path, Some(&body)).await;
        assert_eq!(code, 201, "{path}: {body}");
    }
    let carol = s.kubectl(KubeUser::Token("carol-token"));
    // carol alone may read nothing; as alice, what alice may.
    carol
        .fail(&["get", "pods", "-n", "team-a", "-o", "name"])
        .await;
    let out = carol
        .run(&["get", "pods", "-n", "team-a", "-o", "name", "--as", "alice"])
        .await;
    assert_eq!(out.trim(), "pod/a1");
    let err = carol
        .fail(&["get", "pods", "-n", "team-b", "--as", "alice"])
        .await;
    assert!(
        err.contains(r#"pods is forbidden: User "alice" cannot list resource "pods" in API group "" in the namespace "team-b""#),
        "{err}"
    );
    for (ns, want) in [("team-a", "yes"), ("team-b", "no")] {
        let o = carol
            .output(&["auth", "can-i", "list", "pods", "-n", ns, "--as", "alice"])
            .await;
        assert_eq!(o.stdout.trim(), want, "can-i in {ns}: {}", o.stderr);
    }
    let who = carol
        .run(&[
            "auth",
            "whoami",
            "-o",
            "json",
            "--as",
            "alice",
            "--as-group",
            "dev",
        ])
        .await;
    let who = json_of(&who);
    assert_eq!(who["status"]["userInfo"]["username"], "alice");
    assert_eq!(
        who["status"]["userInfo"]["groups"],
        json!(["dev", "system:authenticated"])
    );
    // Anyone else: kube-apiserver's 403 for the impersonation itself.
    let err = carol
        .fail(&["get", "pods", "-n", "team-a", "--as", "bob"])
        .await;
    assert!(
        err.contains(r#"users "bob" is forbidden: User "carol" cannot impersonate resource "users" in API group "" at the cluster scope"#),
        "{err}"
    );
    let err = carol
        .fail(&[
            "get",
            "pods",
            "-n",
            "team-a",
            "--as",
            "alice",
            "--as-group",
            "ops",
        ])
        .await;
    assert!(
        err.contains(
            r#"groups "ops" is forbidden: User "carol" cannot impersonate resource "groups""#
        ),
        "{err}"
    );
    // A user extra: allowed for `scopes`, with the group in the Status.
    let carol_raw = ClientAuth::token("carol-token")
        .with_header("Impersonate-User", "alice")
        .with_header("Impersonate-Extra-Scopes", "view");
    let (code, body) = s
        .req(
            &carol_raw,
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            Some(&json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})),
        )
        .await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(
        json_of(&body)["status"]["userInfo"]["extra"],
        json!({"scopes": ["view"]})
    );
    let other = ClientAuth::token("carol-token")
        .with_header("Impersonate-User", "alice")
        .with_header("Impersonate-Extra-Team", "x");
    let (code, body) = s
        .req(&other, "GET", "/api/v1/namespaces/team-a/pods", None)
        .await;
    assert_eq!(code, 403, "{body}");
    let status = json_of(&body);
    assert_eq!(
        status["message"],
        r#"userextras.authentication.k8s.io "x" is forbidden: User "carol" cannot impersonate resource "userextras/team" in API group "authentication.k8s.io" at the cluster scope"#
    );
    assert_eq!(
        status["details"],
        json!({"name": "x", "group": "authentication.k8s.io", "kind": "userextras"})
    );
    // A group without a user: 400.
    let no_user = ClientAuth::token("carol-token").with_header("Impersonate-Group", "dev");
    let (code, body) = s
        .req(&no_user, "GET", "/api/v1/namespaces/team-a/pods", None)
        .await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(
        json_of(&body)["message"],
        r#"requested &user.DefaultInfo{Name:"", UID:"", Groups:[]string{"dev"}, Extra:map[string][]string(nil)} without impersonating a user name"#
    );
    // system:masters (cluster-admin) may impersonate anyone.
    let k_admin = s.kubectl(KubeUser::Cert(&s.admin));
    let out = k_admin
        .run(&[
            "auth",
            "whoami",
            "-o",
            "json",
            "--as",
            "system:serviceaccount:team-a:builder",
        ])
        .await;
    assert_eq!(
        json_of(&out)["status"]["userInfo"]["groups"],
        json!([
            "system:serviceaccounts",
            "system:serviceaccounts:team-a",
            "system:authenticated"
        ])
    );
}
