//! A value read from etcd: JSON, or protobuf behind the `k8s\0` magic, for a
//! namespaced built-in resource. A bad value is an error, never a panic.
//! A protobuf value that decodes must encode again; encoding fills Go's
//! zero values (as Go's marshalers write them), so from then on a decode and
//! encode changes nothing: what a client reads is what a later write stores.
//! The one exception is Go's own: a time past year 9999 is written with a
//! five-digit year that Go's parser (and ours) refuses.
#![no_main]

use libfuzzer_sys::fuzz_target;
use watchcache::config::Config;
use watchcache::object::protobuf;

fuzz_target!(|data: &[u8]| {
    let cfg = Config::example();
    for res in &cfg.resources {
        let codec = res.object_codec(&cfg.etcd.prefix);
        let key = codec.key(res.namespaced.then_some("ns1"), "a");
        if let Ok(obj) = codec.decode(&key, data, 7, 3) {
            let _ = obj.wire_at(9);
        }
    }
    let _ = watchcache::object::parse_stored_value("/registry/pods/ns1/a", data);
    if let Ok(json) = protobuf::decode(data) {
        let bytes = match protobuf::encode(&json) {
            Ok(b) => b,
            Err(_) if has_long_year(&json) => return,
            Err(e) => panic!("a decoded object encodes: {e}"),
        };
        let json2 = protobuf::decode(&bytes).expect("an encoded object decodes");
        let again = protobuf::encode(&json2).expect("a decoded object encodes");
        assert_eq!(bytes, again, "a second round trip changed the bytes");
        let json3 = protobuf::decode(&again).expect("an encoded object decodes");
        assert_eq!(json2, json3, "a second round trip changed the object");
    }
});

/// Whether some string of `v` is a time with a year of five or more digits.
fn has_long_year(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::String(s) => {
            s.bytes().take_while(u8::is_ascii_digit).count() > 4 && s.contains('T')
        }
        serde_json::Value::Array(a) => a.iter().any(has_long_year),
        serde_json::Value::Object(o) => o.values().any(has_long_year),
        _ => false,
    }
}
