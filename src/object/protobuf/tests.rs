//! The fixture contract: Kubernetes' own serialization fixtures (k8s.io/api's
//! `testdata/`, from the Go module proxy: `scripts/k8s-modules.sh`, linked at
//! `tools/k8s-api-testdata` by `scripts/setup.sh`). Every `.pb` decodes to its
//! `.json`, every `.json` encodes to its `.pb` byte for byte, for `HEAD` and
//! every older release's directory, as Kubernetes' own compatibility test
//! (`k8s.io/apimachinery/pkg/api/apitesting/roundtrip`) reads them; and bad
//! input yields a typed error, never a panic.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::*;

/// The testdata folder (`HEAD`, `v1.34.0`, ...); `WATCHCACHE_K8S_FIXTURES`
/// may name another one with the same layout.
fn testdata_dir() -> PathBuf {
    match std::env::var_os("WATCHCACHE_K8S_FIXTURES") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tools/k8s-api-testdata"),
    }
}

/// One fixture: what a Go client of one release wrote, and what the
/// newest release reads it as and writes back.
struct Fixture {
    /// `v1.34.0/core.v1.Pod`, for messages.
    name: String,
    stem: String,
    /// What the release wrote to etcd.
    pb: Vec<u8>,
    /// The object as the newest release serves it: the release's `.json`,
    /// or its `.after_roundtrip.json` where the newest release writes it
    /// otherwise (a field since removed, a default since added).
    json: Value,
    /// The bytes the newest release writes for the object: the `.pb`, or
    /// its `.after_roundtrip.pb`.
    pb_after: Vec<u8>,
}

/// The stems (`<group>.<version>.<Kind>`) of one fixture directory's `.pb`s.
fn stems_in(dir: &Path) -> Vec<String> {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| {
        panic!(
            "the Kubernetes API fixtures {} are missing ({e}): run scripts/setup.sh \
             (make test does), which fetches them from the Go module proxy",
            dir.display()
        )
    });
    let mut stems: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter_map(|name| name.strip_suffix(".pb").map(str::to_string))
        .filter(|stem| !stem.ends_with(".after_roundtrip"))
        .collect();
    stems.sort();
    stems
}

/// Every fixture of `HEAD` and of every older release. As in Kubernetes'
/// compatibility test, an older release's fixture is read only when its
/// kind is one the newest release serves (has a `HEAD` fixture): a type
/// since removed, such as 1.34's certificates/v1alpha1
/// PodCertificateRequest, is skipped there too.
fn fixtures() -> Vec<Fixture> {
    let root = testdata_dir();
    let head = stems_in(&root.join("HEAD"));
    assert!(
        head.len() > 100,
        "only {} fixtures in {}/HEAD",
        head.len(),
        root.display()
    );
    let mut sets: Vec<String> = std::fs::read_dir(&root)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .collect();
    sets.sort();
    assert!(
        sets.iter().any(|s| s == "v1.34.0"),
        "no v1.34.0 fixtures in {}",
        root.display()
    );
    let read =
        |path: PathBuf| std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Vec::new();
    for set in &sets {
        let dir = root.join(set);
        for stem in stems_in(&dir) {
            if !head.contains(&stem) {
                continue;
            }
            let pb = read(dir.join(format!("{stem}.pb")));
            let after = dir.join(format!("{stem}.after_roundtrip.json"));
            let json_path = if after.exists() {
                after
            } else {
                dir.join(format!("{stem}.json"))
            };
            let json: Value = serde_json::from_slice(&read(json_path.clone()))
                .unwrap_or_else(|e| panic!("{}: {e}", json_path.display()));
            let after = dir.join(format!("{stem}.after_roundtrip.pb"));
            let pb_after = if after.exists() {
                read(after)
            } else {
                pb.clone()
            };
            out.push(Fixture {
                name: format!("{set}/{stem}"),
                stem,
                pb,
                json,
                pb_after,
            });
        }
    }
    out
}

/// `apps.v1.Deployment` -> ("apps/v1", "Deployment"); `core.v1.Pod` -> ("v1", "Pod").
fn type_from_stem(stem: &str) -> Option<(String, String)> {
    let (rest, kind) = stem.rsplit_once('.')?;
    let (group, version) = rest.rsplit_once('.')?;
    let api_version = if group == "core" {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some((api_version, kind.to_string()))
}

/// Where two byte strings first differ, for failure messages.
fn first_difference(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Go's generated marshalers write every non-pointer field that is not a
/// slice, map or `[]byte`, even when zero (`generated.pb.go`: ObjectMeta's
/// `name`, `generateName`, ... `generation`, `creationTimestamp` are written
/// unconditionally), while kube-apiserver's JSON leaves those zeros out
/// (`omitempty`; `creationTimestamp` is `omitzero` since Kubernetes 1.34, so a
/// zero one is left out too, as kube-apiserver 1.34 serves a template). The bytes below were made by `protoc --encode` (not this
/// codec) from text with the zero fields written out, e.g. for the ConfigMap
/// `metadata { name: "cm" generateName: "" namespace: "ns" selfLink: "" uid: ""
/// resourceVersion: "" generation: 0 creationTimestamp {} } data { key: "k" value: "v" }`,
/// wrapped in `runtime.Unknown` the same way; Lease has `spec {}` (a struct of
/// pointers), PriorityClass `value: 0 globalDefault: false description: ""`.
#[test]
fn zero_non_pointer_fields_are_written_like_go() {
    const CONFIG_MAP: &[u8] = b"\x6b\x38\x73\x00\x0a\x0f\x0a\x02\x76\x31\x12\x09\x43\x6f\x6e\x66\x69\x67\x4d\x61\x70\x12\x1e\x0a\x14\x0a\x02\x63\x6d\x12\x00\x1a\x02\x6e\x73\x22\x00\x2a\x00\x32\x00\x38\x00\x42\x00\x12\x06\x0a\x01\x6b\x12\x01\x76\x1a\x00\x22\x00";
    const LEASE: &[u8] = b"\x6b\x38\x73\x00\x0a\x1f\x0a\x16\x63\x6f\x6f\x72\x64\x69\x6e\x61\x74\x69\x6f\x6e\x2e\x6b\x38\x73\x2e\x69\x6f\x2f\x76\x31\x12\x05\x4c\x65\x61\x73\x65\x12\x17\x0a\x13\x0a\x01\x6c\x12\x00\x1a\x02\x6e\x73\x22\x00\x2a\x00\x32\x00\x38\x00\x42\x00\x12\x00\x1a\x00\x22\x00";
    const PRIORITY_CLASS: &[u8] = b"\x6b\x38\x73\x00\x0a\x25\x0a\x14\x73\x63\x68\x65\x64\x75\x6c\x69\x6e\x67\x2e\x6b\x38\x73\x2e\x69\x6f\x2f\x76\x31\x12\x0d\x50\x72\x69\x6f\x72\x69\x74\x79\x43\x6c\x61\x73\x73\x12\x19\x0a\x11\x0a\x01\x70\x12\x00\x1a\x00\x22\x00\x2a\x00\x32\x00\x38\x00\x42\x00\x10\x00\x18\x00\x22\x00\x1a\x00\x22\x00";
    let cases = [
        (
            CONFIG_MAP,
            json!({"kind": "ConfigMap", "apiVersion": "v1",
                "metadata": {"name": "cm", "namespace": "ns"},
                "data": {"k": "v"}}),
        ),
        (
            LEASE,
            json!({"kind": "Lease", "apiVersion": "coordination.k8s.io/v1",
                "metadata": {"name": "l", "namespace": "ns"},
                "spec": {}}),
        ),
        (
            PRIORITY_CLASS,
            json!({"kind": "PriorityClass", "apiVersion": "scheduling.k8s.io/v1",
                "metadata": {"name": "p"},
                "value": 0}),
        ),
    ];
    for (pb, served) in cases {
        let kind = served["kind"].clone();
        assert_eq!(decode(pb).unwrap(), served, "{kind}: decode");
        assert_eq!(
            encode(&served).unwrap(),
            pb,
            "{kind}: encode what is served"
        );
        // A client's JSON without the zero values (no creationTimestamp, no
        // spec, no value) is what Go decodes into the same struct.
        let mut sparse = served.clone();
        sparse["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("creationTimestamp");
        for key in ["spec", "value"] {
            sparse.as_object_mut().unwrap().remove(key);
        }
        assert_eq!(encode(&sparse).unwrap(), pb, "{kind}: encode sparse JSON");
    }
    // Pointers stay unset when absent or null: ConfigMap.immutable (*bool),
    // ObjectMeta.deletionTimestamp (*Time).
    let with_nulls = json!({"kind": "ConfigMap", "apiVersion": "v1",
        "metadata": {"name": "cm", "namespace": "ns", "deletionTimestamp": null, "creationTimestamp": null},
        "data": {"k": "v"}, "immutable": null});
    assert_eq!(encode(&with_nulls).unwrap(), CONFIG_MAP);
}

/// Filling Go's zero values terminates and succeeds for every message of the
/// schema (no cycle through non-pointer fields, every special type has a zero).
#[test]
fn every_message_encodes_from_empty_json() {
    let schema = Schema::get().unwrap();
    let mut count = 0;
    for desc in schema.all_messages() {
        if schema.is_map_entry(&desc) {
            continue;
        }
        let zero = json::go_zero_json(schema, &desc);
        if let Err(e) = json::json_to_message(schema, &desc, &zero) {
            panic!("{}: {e}", desc.full_name());
        }
        count += 1;
    }
    assert!(count > 1000, "only {count} messages");
}

#[test]
fn every_fixture_round_trips_both_ways() {
    let fixtures = fixtures();
    let mut failures = Vec::new();
    for f in &fixtures {
        let Some((api_version, kind)) = type_from_stem(&f.stem) else {
            failures.push(format!(
                "{}: file name is not <group>.<version>.<Kind>",
                f.name
            ));
            continue;
        };
        match decode_as(&f.pb, &api_version, &kind) {
            Ok(decoded) if decoded == f.json => {}
            Ok(decoded) => failures.push(format!(
                "{}: decode differs:\n  got      {decoded}\n  expected {}",
                f.name, f.json
            )),
            Err(e) => failures.push(format!("{}: decode failed: {e}", f.name)),
        }
        match encode_as(&f.json, &api_version, &kind) {
            Ok(encoded) if encoded == f.pb_after => {}
            Ok(encoded) => failures.push({
                // A debugging aid: the bytes made, to compare with `protoc --decode`.
                if let Some(dump) = std::env::var_os("WATCHCACHE_K8S_FIXTURES_DUMP") {
                    let _ = std::fs::write(
                        PathBuf::from(dump).join(format!("{}.pb", f.name.replace('/', "_"))),
                        &encoded,
                    );
                }
                format!(
                    "{}: encode differs at byte {} (got {} bytes, expected {})",
                    f.name,
                    first_difference(&encoded, &f.pb_after),
                    encoded.len(),
                    f.pb_after.len()
                )
            }),
            Err(e) => failures.push(format!("{}: encode failed: {e}", f.name)),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} fixtures fail:\n{}",
        failures.len(),
        fixtures.len(),
        failures.join("\n")
    );
    assert!(fixtures.len() > 500, "only {} fixtures", fixtures.len());
}

fn pod_bytes() -> Vec<u8> {
    encode(&json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "labels": {"b": "2", "a": "1"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    }))
    .expect("a valid pod encodes")
}

#[test]
fn decode_round_trips_a_small_pod() {
    let pod = decode(&pod_bytes()).expect("decodes");
    assert_eq!(pod["kind"], "Pod");
    assert_eq!(pod["apiVersion"], "v1");
    assert_eq!(pod["metadata"]["labels"], json!({"a": "1", "b": "2"}));
    assert_eq!(pod["spec"]["containers"][0]["image"], "busybox");
}

#[test]
fn truncated_value_is_an_error() {
    let bytes = pod_bytes();
    for cut in [5, bytes.len() / 2, bytes.len() - 1] {
        let err = decode(&bytes[..cut]).expect_err("truncated");
        assert!(
            matches!(
                err,
                ProtobufError::Envelope(_) | ProtobufError::Decode { .. }
            ),
            "cut at {cut}: {err:?}"
        );
    }
}

#[test]
fn wrong_magic_is_an_error() {
    let mut bytes = pod_bytes();
    bytes[3] = b'1';
    assert_eq!(decode(&bytes), Err(ProtobufError::NotProtobuf));
    assert_eq!(
        decode(b"{\"kind\":\"Pod\"}"),
        Err(ProtobufError::NotProtobuf)
    );
    assert_eq!(decode(b""), Err(ProtobufError::NotProtobuf));
}

#[test]
fn unknown_kind_is_an_error() {
    let mut object = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}});
    let bytes = encode(&object).expect("encodes");
    // Rewrite the envelope's kind: same length, so the framing stays valid.
    let at = bytes
        .windows(3)
        .position(|w| w == b"Pod")
        .expect("kind in envelope");
    let mut renamed = bytes.clone();
    renamed[at..at + 3].copy_from_slice(b"Pxd");
    assert_eq!(
        decode(&renamed),
        Err(ProtobufError::UnknownKind {
            api_version: "v1".into(),
            kind: "Pxd".into()
        })
    );
    object["apiVersion"] = json!("example.com/v1");
    assert!(matches!(
        encode(&object),
        Err(ProtobufError::UnknownKind { .. })
    ));
}

#[test]
fn garbage_is_an_error() {
    let mut value = MAGIC.to_vec();
    value.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0x07, 0x01, 0x02]);
    assert!(matches!(decode(&value), Err(ProtobufError::Envelope(_))));
    // A valid envelope around a payload that is not a Pod.
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    for _ in 0..200 {
        let mut payload = Vec::new();
        for _ in 0..40 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            payload.push(seed as u8);
        }
        let value = wrap_message("v1", "Pod", &payload).expect("envelope");
        // Either an error or (rarely) a valid message: never a panic.
        let _ = decode(&value);
    }
}

#[test]
fn json_that_does_not_fit_the_schema_is_an_error() {
    let err = encode(
        &json!({"apiVersion": "v1", "kind": "Pod", "spec": {"containers": [{"nmae": "c"}]}}),
    )
    .expect_err("unknown field");
    assert_eq!(
        err,
        ProtobufError::Json {
            path: "spec.containers.0.nmae".into(),
            reason: "unknown field \"nmae\"".into()
        }
    );
    let err = encode(&json!({"apiVersion": "v1", "kind": "Pod", "spec": {"priority": "high"}}))
        .expect_err("wrong type");
    assert!(
        matches!(err, ProtobufError::Json { ref path, .. } if path == "spec.priority"),
        "{err:?}"
    );
}

#[test]
fn resolves_groups_named_unlike_their_package() {
    let schema = Schema::get().expect("schema");
    let name = |v: &str, k: &str| schema.resolve(v, k).map(|m| m.full_name().to_string());
    assert_eq!(name("v1", "Pod").as_deref(), Some("k8s.io.api.core.v1.Pod"));
    assert_eq!(
        name("apps/v1", "Deployment").as_deref(),
        Some("k8s.io.api.apps.v1.Deployment")
    );
    assert_eq!(
        name("internal.apiserver.k8s.io/v1alpha1", "StorageVersion").as_deref(),
        Some("k8s.io.api.apiserverinternal.v1alpha1.StorageVersion")
    );
    assert_eq!(
        name("v1", "Status").as_deref(),
        Some("k8s.io.apimachinery.pkg.apis.meta.v1.Status")
    );
    assert_eq!(
        name("apiextensions.k8s.io/v1", "CustomResourceDefinition").as_deref(),
        Some("k8s.io.apiextensions_apiserver.pkg.apis.apiextensions.v1.CustomResourceDefinition")
    );
    assert_eq!(name("example.com/v1", "Widget"), None);
    assert_eq!(name("v1", "ObjectMeta"), None);
}

/// Every fixture with bytes flipped or cut: decoding gives a value or a
/// typed error, never a panic.
#[test]
fn mutated_fixtures_never_panic() {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut checked = 0;
    // The newest release's fixtures: every kind once.
    for f in fixtures().iter().filter(|f| f.name.starts_with("HEAD/")) {
        let bytes = &f.pb;
        for _ in 0..20 {
            let mut m = bytes.clone();
            for _ in 0..1 + next() % 4 {
                let at = 4 + (next() as usize) % (m.len() - 4).max(1);
                if at < m.len() {
                    m[at] = next() as u8;
                }
            }
            if next() % 3 == 0 {
                m.truncate(4 + (next() as usize) % m.len());
            }
            let _ = decode(&m);
            checked += 1;
        }
    }
    assert!(checked > 1000, "only {checked} mutations checked");
}

/// Fields without `omitempty` are served even when unset, as Go writes them:
/// an aggregated ClusterRole's nil `rules` is `"rules": null`.
#[test]
fn unset_fields_without_omitempty_are_null() {
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "admin"},
        "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"a": "b"}}]}
    });
    let decoded = decode(&encode(&role).expect("encodes")).expect("decodes");
    assert_eq!(decoded["rules"], Value::Null);
    assert!(decoded.as_object().expect("object").contains_key("rules"));
    // An omitempty one stays absent.
    assert!(
        !decoded["metadata"]
            .as_object()
            .expect("metadata")
            .contains_key("labels")
    );
}

/// apiextensions.k8s.io (CustomResourceDefinitions, stored as protobuf by
/// kube-apiserver too): the CRD schema types with their own Go JSON forms
/// (`JSON`, `JSONSchemaPropsOr{Bool,Array,StringArray}`, `$ref`) round-trip.
#[test]
fn custom_resource_definitions_round_trip() {
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"plural": "widgets", "kind": "Widget"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": true,
                    "properties": {
                        "spec": {
                            "type": "object",
                            "additionalProperties": false,
                            "properties": {
                                "size": {"type": "integer", "default": 3, "enum": [1, 3, 5]},
                                "tags": {"type": "array", "items": {"type": "string"}},
                                "meta": {"type": "object", "additionalProperties": {"type": "string"}},
                                "ref": {"$ref": "#/definitions/x"}
                            },
                            "dependencies": {"size": ["tags"]}
                        }
                    }
                }}
            }]
        }
    });
    let bytes = encode(&crd).expect("a CRD encodes");
    // Go writes the zero values of the non-pointer fields the JSON left out
    // (see `zero_non_pointer_fields_are_written_like_go`), so the object
    // comes back as kube-apiserver serves a new CRD.
    let mut served = crd.clone();
    served["status"] = json!({
        "acceptedNames": {"kind": "", "plural": ""},
        "conditions": null,
        "storedVersions": null
    });
    assert_eq!(decode(&bytes).expect("decodes"), served);
    assert_eq!(encode(&served).expect("encodes"), bytes);
}

/// Every fixture with an `ObjectMeta`: the stored message served at a
/// revision ([`StoredMessage::at`]) is byte for byte what the decoded JSON
/// with that resourceVersion encodes to, whatever resourceVersion the
/// stored bytes carried (the fixtures' are random strings; kube-apiserver's
/// are empty).
#[test]
fn stored_messages_at_a_revision_are_the_json_encoded() {
    let schema = Schema::get().expect("schema");
    let mut checked = 0;
    let mut failures = Vec::new();
    for f in fixtures().iter().filter(|f| f.name.starts_with("HEAD/")) {
        let (stem, pb) = (&f.name, &f.pb);
        let (api_version, kind) = type_from_stem(&f.stem).expect("fixture name");
        let (mut json, stored) = decode_parts(schema, pb, Some((&api_version, &kind)), 0)
            .unwrap_or_else(|e| panic!("{stem}: {e}"));
        let has_meta = resolve(schema, &api_version, &kind)
            .expect("resolves")
            .get_field_by_name("metadata")
            .is_some_and(|f| matches!(f.kind(), prost_reflect::Kind::Message(m) if m.full_name() == OBJECT_META));
        match stored.at(4242) {
            Some(got) => {
                assert!(
                    has_meta,
                    "{stem}: no ObjectMeta, yet a message at a revision"
                );
                assert!(
                    crate::object::set_resource_version(&mut json, 4242),
                    "{stem}: no metadata in the JSON"
                );
                let expected = encode_message(json, &api_version, &kind).expect("encodes");
                if got[..] != expected[..] {
                    failures.push(format!(
                        "{stem}: differs at byte {} (got {} bytes, expected {})",
                        first_difference(&got, &expected),
                        got.len(),
                        expected.len()
                    ));
                }
                checked += 1;
            }
            None => assert!(
                !has_meta,
                "{stem}: has an ObjectMeta, yet no message at a revision"
            ),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(checked >= 50, "only {checked} fixtures with an ObjectMeta");
}

/// The splice itself: the field is written where Go writes it, an old value
/// is replaced, and anything that is not one well-formed sub-message is
/// refused rather than guessed at.
#[test]
fn resource_version_is_spliced_where_go_writes_it() {
    let field = |n: u32, v: &[u8]| {
        let mut out = Vec::new();
        encoding::encode_key(n, WireType::LengthDelimited, &mut out);
        encoding::encode_varint(v.len() as u64, &mut out);
        out.extend_from_slice(v);
        out
    };
    let varint = |n: u32, v: u64| {
        let mut out = Vec::new();
        encoding::encode_key(n, WireType::Varint, &mut out);
        encoding::encode_varint(v, &mut out);
        out
    };
    let meta = |parts: &[Vec<u8>]| field(1, &parts.concat());
    let spec = field(2, b"spec-bytes");
    // No field 6 at all: inserted before field 7.
    let message = [meta(&[field(1, b"name"), varint(7, 3)]), spec.clone()].concat();
    let want = [
        meta(&[field(1, b"name"), field(6, b"42"), varint(7, 3)]),
        spec.clone(),
    ]
    .concat();
    assert_eq!(with_field_in(&message, 1, 6, b"42"), Some(want.clone()));
    // An old value (empty, as kube-apiserver stores it, or not) is replaced.
    for old in [&b""[..], b"a-much-longer-old-value-than-the-new-one"] {
        let message = [
            meta(&[field(1, b"name"), field(6, old), varint(7, 3)]),
            spec.clone(),
        ]
        .concat();
        assert_eq!(with_field_in(&message, 1, 6, b"42"), Some(want.clone()));
    }
    // Last field of the sub-message: appended.
    let message = [meta(&[field(1, b"name")]), spec.clone()].concat();
    let want_end = [meta(&[field(1, b"name"), field(6, b"42")]), spec.clone()].concat();
    assert_eq!(with_field_in(&message, 1, 6, b"42"), Some(want_end));
    // Refused: no sub-message, two of them, one that is not length-delimited,
    // truncated input, garbage inside the sub-message.
    assert_eq!(with_field_in(&spec, 1, 6, b"42"), None);
    let twice = [meta(&[]), meta(&[]), spec.clone()].concat();
    assert_eq!(with_field_in(&twice, 1, 6, b"42"), None);
    assert_eq!(with_field_in(&varint(1, 5), 1, 6, b"42"), None);
    assert_eq!(
        with_field_in(&message[..message.len() - 1], 1, 6, b"42"),
        None
    );
    assert_eq!(with_field_in(&field(1, b"\xff\xff\xff"), 1, 6, b"42"), None);
}

/// A field this build's schema does not know (a newer Kubernetes wrote it)
/// is not in the JSON, but stays in the message protobuf clients get.
#[test]
fn stored_fields_unknown_to_the_schema_reach_protobuf_clients() {
    let schema = Schema::get().expect("schema");
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    });
    let mut raw = encode_message(pod.clone(), "v1", "Pod").expect("encodes");
    let mut future = Vec::new();
    encoding::encode_key(99, WireType::LengthDelimited, &mut future);
    encoding::encode_varint(6, &mut future);
    future.extend_from_slice(b"future");
    raw.extend_from_slice(&future);
    let stored = wrap(schema, "v1", "Pod", &raw).expect("wraps");
    let (mut json, message) = decode_stored(&stored).expect("decodes");
    assert!(!json.to_string().contains("future"), "{json}");
    let served = message.at(7).expect("a Pod has an ObjectMeta");
    assert!(served.ends_with(&future), "the unknown field is kept");
    assert!(crate::object::set_resource_version(&mut json, 7));
    let known = encode_message(json, "v1", "Pod").expect("encodes");
    assert_eq!(&served[..served.len() - future.len()], &known[..]);
}

/// A protobuf watch frame is a bare `meta.v1.WatchEvent` message, as
/// kube-apiserver's raw stream serializer writes it: field 1 the type, field
/// 2 a `RawExtension` whose field 1 is the object's full `k8s\0` value. A
/// `k8s\0` envelope around it makes client-go fail (`proto: illegal
/// wireType`).
#[test]
fn a_watch_event_is_a_bare_message_around_an_enveloped_object() {
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"}});
    let object = encode(&pod).expect("a Pod encodes");
    let frame = encode_watch_event("ADDED", object.clone()).expect("encodes");
    let mut expected = vec![0x0a, 5];
    expected.extend_from_slice(b"ADDED");
    let mut raw = vec![0x0a];
    push_varint(&mut raw, object.len());
    raw.extend_from_slice(&object);
    expected.push(0x12);
    push_varint(&mut expected, raw.len());
    expected.extend_from_slice(&raw);
    assert_eq!(frame, expected);
    assert!(!frame.starts_with(MAGIC));
    let event = decode_watch_event(&frame).expect("decodes");
    assert_eq!(event["type"], "ADDED");
    assert_eq!(event["object"]["metadata"]["name"], "a");
    assert_eq!(event["object"]["kind"], "Pod");
    // Not a WatchEvent: a typed error, no panic.
    assert!(decode_watch_event(b"k8s\0\x0a\xff").is_err());
}

fn push_varint(out: &mut Vec<u8>, mut n: usize) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}
