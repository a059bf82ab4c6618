//! Unit tests of the object codec (decode, wire, helpers).

use super::*;
use crate::config::ResourceConfig;
use serde_json::json;

/// A Pod-like resource config for unit tests (shared by the cacher's).
pub(crate) fn resource(namespaced: bool, indexes: &[&str]) -> ResourceConfig {
    ResourceConfig {
        group: String::new(),
        version: "v1".into(),
        kind: "Pod".into(),
        plural: "pods".into(),
        namespaced,
        indexes: indexes.iter().map(|s| s.to_string()).collect(),
        history_capacity: Some(100),
        key_prefix: None,
        ttl_seconds: None,
        storage_encoding: Default::default(),
        short_names: None,
        categories: None,
        ..Default::default()
    }
}

/// A bare object for unit tests elsewhere (snapshots, history, Lists):
/// `/r/pods/{ns}/{name}` with no labels or fields, at revision 1.
pub(crate) fn object(ns: &str, name: &str, wire: impl Into<bytes::Bytes>) -> Object {
    Object {
        key: Arc::from(format!("/r/pods/{ns}/{name}").as_str()),
        namespace: Some(Arc::from(ns)),
        name: Arc::from(name),
        uid: None,
        labels: BTreeMap::new(),
        fields: Vec::new(),
        creation_timestamp: None,
        mod_revision: 1,
        create_revision: 1,
        wire: wire.into(),
        protobuf: Default::default(),
    }
}

/// `n` objects `p00000`.. of namespace `a`, decoded by `c`, labelled
/// `app={app(i)}`: the cacher's tests of large selections.
pub(crate) fn labelled(
    c: &ObjectCodec,
    n: usize,
    app: impl Fn(usize) -> &'static str,
) -> Vec<Arc<Object>> {
    (0..n)
        .map(|i| {
            let name = format!("p{i:05}");
            let v = format!(
                r#"{{"metadata":{{"name":"{name}","namespace":"a","labels":{{"app":"{}"}}}}}}"#,
                app(i)
            );
            Arc::new(
                c.decode(&c.key(Some("a"), &name), v.as_bytes(), 1, 1)
                    .expect("decode"),
            )
        })
        .collect()
}

fn pods() -> ObjectCodec {
    resource(true, &["spec.nodeName", "status.phase", "spec.priority"]).object_codec("/registry")
}

fn nodes() -> ObjectCodec {
    let mut r = resource(false, &[]);
    r.kind = "Node".into();
    r.plural = "nodes".into();
    r.object_codec("/registry/")
}

fn wire_json(o: &Object) -> Value {
    serde_json::from_slice(&o.wire).expect("wire is valid JSON")
}

#[test]
fn codec_keys_and_accessors() {
    let c = pods();
    assert_eq!(c.key_prefix(), "/registry/pods/");
    assert!(c.is_namespaced());
    assert_eq!(c.key(Some("default"), "a"), "/registry/pods/default/a");
    assert_eq!(c.namespace_prefix("default"), "/registry/pods/default/");
    assert_eq!(&**c.api_version(), "v1");
    assert_eq!(&**c.kind(), "Pod");
    let paths: Vec<&str> = c.index_paths().iter().map(|p| &**p).collect();
    assert_eq!(paths, ["spec.nodeName", "status.phase", "spec.priority"]);

    let n = nodes();
    assert_eq!(n.key_prefix(), "/registry/nodes/");
    assert_eq!(n.key(None, "n1"), "/registry/nodes/n1");
    assert_eq!(n.key(Some("ignored"), "n1"), "/registry/nodes/n1");

    let mut g = resource(true, &["spec.x", "spec.x", "metadata.name"]);
    g.group = "apps".into();
    g.plural = "deployments".into();
    g.kind = "Deployment".into();
    let g = g.object_codec("/registry");
    assert_eq!(g.key_prefix(), "/registry/apps/deployments/");
    assert_eq!(&**g.api_version(), "apps/v1");
    assert_eq!(
        g.index_paths().len(),
        1,
        "duplicates and metadata.* dropped"
    );

    let mut o = resource(true, &[]);
    o.key_prefix = Some("/custom/things".into());
    assert_eq!(o.object_codec("/registry").key_prefix(), "/custom/things/");
}

#[test]
fn decode_namespaced() {
    let c = pods();
    let v = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "a", "namespace": "default", "uid": "u-1",
            "creationTimestamp": "2024-01-01T00:00:00Z",
            "resourceVersion": "999",
            "labels": {"app": "web", "tier": "fe", "bad": 5, "alsobad": null}
        },
        "spec": {"nodeName": "n1", "priority": 7},
        "status": {"phase": true}
    });
    let o = c
        .decode("/registry/pods/default/a", v.to_string().as_bytes(), 12, 10)
        .unwrap();
    assert_eq!(&*o.key, "/registry/pods/default/a");
    assert_eq!(o.namespace.as_deref(), Some("default"));
    assert_eq!(&*o.name, "a");
    assert_eq!(o.uid.as_deref(), Some("u-1"));
    assert_eq!(
        o.creation_timestamp.as_deref(),
        Some("2024-01-01T00:00:00Z")
    );
    assert_eq!(o.mod_revision, 12);
    assert_eq!(o.create_revision, 10);
    assert_eq!(o.resource_version(), 12);
    let labels: Vec<(&str, &str)> = o
        .labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(labels, [("app", "web"), ("tier", "fe")]);
    let fields: Vec<(&str, &str)> = o.fields.iter().map(|(k, v)| (&**k, v.as_str())).collect();
    assert_eq!(
        fields,
        [
            ("spec.nodeName", "n1"),
            ("status.phase", "true"),
            ("spec.priority", "7")
        ]
    );
    assert_eq!(o.field("metadata.name"), Some("a"));
    assert_eq!(o.field("metadata.namespace"), Some("default"));
    assert_eq!(o.field("spec.nodeName"), Some("n1"));
    assert_eq!(o.field("spec.priority"), Some("7"));

    let w = wire_json(&o);
    assert_eq!(w["metadata"]["resourceVersion"], "12", "RV replaced");
    assert_eq!(w["spec"], v["spec"]);
    assert_eq!(w["metadata"]["labels"], v["metadata"]["labels"]);
}

#[test]
fn decode_cluster_scoped_and_missing_metadata() {
    let n = nodes();
    let o = n
        .decode("/registry/nodes/n1", br#"{"kind":"Node"}"#, 5, 5)
        .unwrap();
    assert_eq!(o.namespace, None);
    assert_eq!(&*o.name, "n1");
    assert_eq!(o.uid, None);
    assert_eq!(o.creation_timestamp, None);
    assert!(o.labels.is_empty());
    assert_eq!(o.field("metadata.namespace"), Some(""));
    assert_eq!(
        wire_json(&o),
        json!({"kind":"Node","metadata":{"resourceVersion":"5"}})
    );
    // null metadata is replaced, too
    let o = n
        .decode("/registry/nodes/n1", br#"{"metadata":null}"#, 6, 5)
        .unwrap();
    assert_eq!(wire_json(&o), json!({"metadata":{"resourceVersion":"6"}}));
}

#[test]
fn decode_index_fields_missing_and_odd_types() {
    let c = pods();
    let v = json!({"metadata": {}, "spec": {"nodeName": {"nested": 1}, "priority": -1.5},
        "status": "notanobject"});
    let o = c
        .decode("/registry/pods/ns/p", v.to_string().as_bytes(), 3, 3)
        .unwrap();
    let fields: Vec<(&str, &str)> = o.fields.iter().map(|(k, v)| (&**k, v.as_str())).collect();
    assert_eq!(fields, [("spec.priority", "-1.5")]);
    // Missing index fields read as "" (Kubernetes semantics).
    assert_eq!(o.field("spec.nodeName"), Some(""));
    assert_eq!(o.field("status.phase"), Some(""));
    // Not a field path at all.
    assert_eq!(o.field(""), None);
    assert_eq!(o.field("spec..x"), None);

    let o = c
        .decode(
            "/registry/pods/ns/p",
            br#"{"spec":{"nodeName":null}}"#,
            3,
            3,
        )
        .unwrap();
    assert!(o.fields.is_empty());
    assert_eq!(o.field("spec.nodeName"), Some(""));
}

#[test]
fn decode_bad_keys() {
    let c = pods();
    let ok = br#"{}"#;
    for key in [
        "/registry/pods/default",     // no name
        "/registry/pods/default/",    // empty name
        "/registry/pods//a",          // empty namespace
        "/registry/pods/default/a/b", // too deep
        "/registry/podsx/default/a",  // wrong prefix
        "/registry/pods",             // prefix without slash
        "/registry/pods/",            // nothing
        "",                           // empty
        "/other/pods/default/a",      // other prefix
    ] {
        match c.decode(key, ok, 1, 1) {
            Err(ObjectError::InvalidKey { key: k, .. }) => assert_eq!(k, key),
            other => panic!("{key:?}: want InvalidKey, got {other:?}"),
        }
    }
    let n = nodes();
    for key in ["/registry/nodes/", "/registry/nodes/a/b", "/registry/nodes"] {
        assert!(
            matches!(n.decode(key, ok, 1, 1), Err(ObjectError::InvalidKey { .. })),
            "{key:?}"
        );
    }
    let e = c.decode("/x", ok, 1, 1).unwrap_err();
    assert!(e.to_string().contains("\"/x\""), "{e}");
}

#[test]
fn decode_bad_values() {
    let c = pods();
    let key = "/registry/pods/ns/a";
    for v in [&b"[]"[..], b"\"str\"", b"1", b"null", b"true"] {
        assert_eq!(
            c.decode(key, v, 1, 1),
            Err(ObjectError::NotJsonObject { key: key.into() }),
            "{:?}",
            String::from_utf8_lossy(v)
        );
    }
    for v in [
        &b""[..],
        b"{",
        b"{\"a\":}",
        b"\xff\xfe",
        b"{} trailing",
        b"\x00",
    ] {
        assert!(
            matches!(c.decode(key, v, 1, 1), Err(ObjectError::InvalidJson { .. })),
            "{:?}",
            String::from_utf8_lossy(v)
        );
    }
    for v in [&br#"{"metadata":[]}"#[..], br#"{"metadata":"x"}"#] {
        assert_eq!(
            c.decode(key, v, 1, 1),
            Err(ObjectError::InvalidMetadata { key: key.into() })
        );
    }
    // Deep nesting is an error (serde_json's recursion limit), not a crash.
    let deep = format!("{{\"a\":{}{}}}", "[".repeat(10_000), "]".repeat(10_000));
    assert!(matches!(
        c.decode(key, deep.as_bytes(), 1, 1),
        Err(ObjectError::InvalidJson { .. })
    ));
}

#[test]
fn decode_odd_strings_never_panics() {
    let c = pods();
    let odd = [
        "",
        "/",
        "//",
        "\u{0}",
        "é",
        "名前",
        "a/b/c",
        "\\",
        "\"",
        "\u{1F600}",
        " ",
        "\n",
    ];
    for a in odd {
        for b in odd {
            let key = format!("/registry/pods/{a}/{b}");
            let _ = c.decode(&key, br#"{"metadata":{"labels":{"k":"v"}}}"#, 1, 1);
            let _ = c.decode(&key, a.as_bytes(), 1, 1);
            let _ = c.decode(a, b.as_bytes(), i64::MIN, i64::MAX);
        }
    }
    // Unicode namespace/name survive.
    let o = c.decode("/registry/pods/名前/é", b"{}", 1, 1).unwrap();
    assert_eq!(o.namespace.as_deref(), Some("名前"));
    assert_eq!(&*o.name, "é");
}

#[test]
fn wire_at_rerenders_resource_version() {
    let c = pods();
    let v = json!({"kind":"Pod","metadata":{"name":"a","uid":"u"},"spec":{"x":[1,2,{"y":"z"}]}});
    let o = c
        .decode("/registry/pods/ns/a", v.to_string().as_bytes(), 10, 4)
        .unwrap();
    let same = o.wire_at(10);
    assert_eq!(same, o.wire);
    let later: Value = serde_json::from_slice(&o.wire_at(42)).unwrap();
    assert_eq!(later["metadata"]["resourceVersion"], "42");
    let mut expect = wire_json(&o);
    expect["metadata"]["resourceVersion"] = json!("42");
    assert_eq!(later, expect);
    // The original is untouched.
    assert_eq!(wire_json(&o)["metadata"]["resourceVersion"], "10");
}

#[test]
fn json_helpers() {
    let mut v = json!({"metadata":{"name":"a","resourceVersion":"5"}});
    assert_eq!(metadata_str(&v, "name"), Some("a"));
    assert_eq!(metadata_str(&v, "resourceVersion"), Some("5"));
    strip_resource_version(&mut v);
    assert_eq!(v, json!({"metadata":{"name":"a"}}));
    strip_resource_version(&mut v); // idempotent
    assert!(set_resource_version(&mut v, 7));
    assert_eq!(metadata_str(&v, "resourceVersion"), Some("7"));

    let mut empty = json!({});
    assert!(metadata(&empty).is_none());
    metadata_mut(&mut empty)
        .unwrap()
        .insert("uid".into(), json!("u"));
    assert_eq!(empty, json!({"metadata":{"uid":"u"}}));

    for mut bad in [json!([]), json!("s"), json!(null), json!({"metadata": 3})] {
        let before = bad.clone();
        assert!(metadata_mut(&mut bad).is_none());
        assert!(!set_resource_version(&mut bad, 1));
        strip_resource_version(&mut bad);
        assert_eq!(bad, before);
        assert_eq!(metadata_str(&bad, "name"), None);
    }

    let v = json!({"spec":{"nodeName":"n","n":{"m":3}}});
    assert_eq!(lookup_path(&v, "spec.nodeName"), Some(&json!("n")));
    assert_eq!(lookup_path(&v, "spec.n.m"), Some(&json!(3)));
    assert_eq!(lookup_path(&v, "spec.nodeName.x"), None);
    assert_eq!(lookup_path(&v, "nope"), None);
    assert_eq!(field_string(&json!(3)), Some("3".into()));
    assert_eq!(field_string(&json!(false)), Some("false".into()));
    assert_eq!(field_string(&json!("s")), Some("s".into()));
    assert_eq!(field_string(&json!(null)), None);
    assert_eq!(field_string(&json!([1])), None);
}

#[test]
fn object_is_small() {
    // Memory per cached object matters: keep the fixed part compact.
    assert!(
        std::mem::size_of::<Object>() <= 192,
        "{}",
        std::mem::size_of::<Object>()
    );
}

/// A protobuf Pod as kube-apiserver stores it, made by the protobuf codec.
fn protobuf_pod() -> Vec<u8> {
    protobuf::encode(&json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p1", "namespace": "ns", "uid": "u-1",
            "creationTimestamp": "2024-01-02T03:04:05Z",
            "labels": {"app": "web"}
        },
        "spec": {"nodeName": "node-a", "priority": 7, "containers": [{"name": "c", "image": "nginx"}]},
        "status": {"phase": "Running"}
    }))
    .expect("a valid Pod encodes")
}

#[test]
fn decode_reads_protobuf_values_like_json_ones() {
    let c = pods();
    let o = c
        .decode("/registry/pods/ns/p1", &protobuf_pod(), 42, 40)
        .expect("protobuf Pod decodes");
    assert_eq!(o.uid.as_deref(), Some("u-1"));
    assert_eq!(o.labels.get("app").map(String::as_str), Some("web"));
    assert_eq!(
        o.creation_timestamp.as_deref(),
        Some("2024-01-02T03:04:05Z")
    );
    assert_eq!(o.field("spec.nodeName"), Some("node-a"));
    assert_eq!(o.field("spec.priority"), Some("7"));
    assert_eq!(o.field("status.phase"), Some("Running"));
    let wire = wire_json(&o);
    assert_eq!(wire["kind"], "Pod");
    assert_eq!(wire["apiVersion"], "v1");
    assert_eq!(wire["metadata"]["resourceVersion"], "42");
    assert_eq!(wire["spec"]["containers"][0]["image"], "nginx");
}

#[test]
fn decode_rejects_unreadable_protobuf_with_a_typed_error() {
    let c = pods();
    let key = "/registry/pods/ns/p1";
    let good = protobuf_pod();
    let truncated = &good[..good.len() - 3];
    let mut unknown_kind =
        protobuf::encode(&json!({"apiVersion": "v1", "kind": "Pod"})).expect("encodes");
    let at = unknown_kind
        .windows(3)
        .position(|w| w == b"Pod")
        .expect("kind in the envelope");
    unknown_kind[at..at + 3].copy_from_slice(b"Pxd");
    for (what, value) in [
        ("truncated", truncated.to_vec()),
        ("unknown kind", unknown_kind),
        ("garbage", b"k8s\0\xff\xff\xff".to_vec()),
    ] {
        match c.decode(key, &value, 1, 1) {
            Err(ObjectError::InvalidProtobuf { key: k, .. }) => assert_eq!(k, key, "{what}"),
            other => panic!("{what}: {other:?}"),
        }
    }
}

#[test]
fn a_clone_does_not_keep_the_protobuf_message() {
    let pod = |name: &str| {
        serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}}))
            .expect("json")
    };
    let a = object("ns", "a", pod("a"));
    let first = a.protobuf_message("v1", "Pod").expect("encodes");
    let mut b = a.clone();
    b.wire = pod("b").into();
    let second = b.protobuf_message("v1", "Pod").expect("encodes");
    assert_ne!(first, second, "the clone encodes its own wire");
    let served = protobuf::wrap_message("v1", "Pod", &second).expect("wraps");
    assert_eq!(
        protobuf::decode(&served).expect("decodes")["metadata"]["name"],
        "b"
    );
    assert_eq!(a.protobuf_message("v1", "Pod").expect("cached"), first);
}

/// A cluster that stores protobuf: the stored message is kept as the one
/// protobuf clients get (with the key's revision as its resourceVersion),
/// the same bytes the JSON would encode to, so nothing is encoded on their
/// first read.
#[test]
fn a_stored_protobuf_message_is_kept_for_protobuf_clients() {
    let c = pods();
    let o = c
        .decode("/registry/pods/ns/p1", &protobuf_pod(), 42, 40)
        .expect("protobuf Pod decodes");
    assert!(o.protobuf.is_filled(), "kept from the stored value");
    let kept = o.protobuf_message("v1", "Pod").expect("kept");
    let encoded = protobuf::encode_message(wire_json(&o), "v1", "Pod").expect("the JSON encodes");
    assert_eq!(
        kept, encoded,
        "the stored message at revision 42 is the JSON's"
    );
    let served = protobuf::wrap_message("v1", "Pod", &kept).expect("wraps");
    let back = protobuf::decode(&served).expect("decodes");
    assert_eq!(back["metadata"]["resourceVersion"], "42");
    assert_eq!(back, wire_json(&o));

    // JSON values, and protobuf of another type than the resource's, are
    // encoded on first read as before.
    let json = serde_json::to_vec(&wire_json(&o)).expect("json");
    let from_json = c
        .decode("/registry/pods/ns/p1", &json, 43, 40)
        .expect("JSON decodes");
    assert!(!from_json.protobuf.is_filled());
    let config_map = protobuf::encode(
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "p1"}}),
    )
    .expect("encodes");
    let other = c
        .decode("/registry/pods/ns/p1", &config_map, 44, 40)
        .expect("decodes");
    assert!(!other.protobuf.is_filled(), "not a Pod: not kept as one");
}
