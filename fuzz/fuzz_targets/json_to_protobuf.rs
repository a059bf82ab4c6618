//! A client's JSON body stored or served as protobuf: any JSON value either
//! encodes or is refused, and what encodes decodes to JSON that encodes to
//! the same bytes (the encoding is a fixed point after one pass).
#![no_main]

use libfuzzer_sys::fuzz_target;
use watchcache::object::protobuf;

fuzz_target!(|data: &[u8]| {
    let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    for (api_version, kind) in [
        ("v1", "Pod"),
        ("v1", "ConfigMap"),
        ("apps/v1", "Deployment"),
    ] {
        if let Some(obj) = value.as_object_mut() {
            obj.insert("apiVersion".into(), api_version.into());
            obj.insert("kind".into(), kind.into());
        }
        let Ok(bytes) = protobuf::encode_as(&value, api_version, kind) else {
            continue;
        };
        let decoded =
            protobuf::decode_as(&bytes, api_version, kind).expect("what was encoded decodes");
        let again =
            protobuf::encode_as(&decoded, api_version, kind).expect("a decoded object encodes");
        let decoded2 =
            protobuf::decode_as(&again, api_version, kind).expect("what was encoded decodes");
        assert_eq!(decoded, decoded2, "second round trip changed the object");
    }
});
