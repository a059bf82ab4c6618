//! What kube-apiserver does to a built-in object between the client's JSON
//! and etcd that changes what is stored, beyond defaulting: a v1 Secret's
//! write-only `stringData` is merged into `data` (base64), the key of
//! `stringData` winning (`Convert_v1_Secret_To_core_Secret`), and a Secret
//! without a `type` is `Opaque` (`SetDefaults_Secret`). A Secret written
//! through watchcache is then stored, and read back through kube-apiserver,
//! as kube-apiserver would have stored it.

use base64::Engine as _;
use serde_json::{Map, Value};

/// Whether objects of (`api_version`, `kind`) are converted before storage.
pub fn converts(api_version: &str, kind: &str) -> bool {
    api_version == "v1" && kind == "Secret"
}

/// Applies kube-apiserver's write-time conversion to `object` of
/// (`api_version`, `kind`) in place. Other types are left as they are.
pub fn convert_for_storage(api_version: &str, kind: &str, object: &mut Value) {
    if converts(api_version, kind) {
        secret(object);
    }
}

fn secret(object: &mut Value) {
    let Some(o) = object.as_object_mut() else {
        return;
    };
    if let Some(Value::Object(string_data)) = o.remove("stringData") {
        let data = o.entry("data").or_insert_with(|| Value::Object(Map::new()));
        if !data.is_object() {
            *data = Value::Object(Map::new());
        }
        if let Value::Object(data) = data {
            for (k, v) in string_data {
                if let Value::String(s) = v {
                    let encoded = base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
                    data.insert(k, Value::String(encoded));
                }
            }
        }
    }
    let untyped = match o.get("type") {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.is_empty(),
        Some(_) => false,
    };
    if untyped {
        o.insert("type".into(), Value::String("Opaque".into()));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn secret_string_data_is_merged_into_data_and_wins() {
        let mut s = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
            "data": {"a": "b2xk", "keep": "eA=="}, "stringData": {"a": "new", "b": "t0p"}});
        convert_for_storage("v1", "Secret", &mut s);
        assert_eq!(
            s,
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                "data": {"a": "bmV3", "keep": "eA==", "b": "dDBw"}, "type": "Opaque"})
        );
    }

    #[test]
    fn secret_type_is_kept_and_other_kinds_untouched() {
        let mut s =
            json!({"kind": "Secret", "type": "kubernetes.io/tls", "stringData": {"x": "y"}});
        convert_for_storage("v1", "Secret", &mut s);
        assert_eq!(
            s,
            json!({"kind": "Secret", "type": "kubernetes.io/tls", "data": {"x": "eQ=="}})
        );
        let mut cm = json!({"kind": "ConfigMap", "stringData": {"x": "y"}});
        let before = cm.clone();
        convert_for_storage("v1", "ConfigMap", &mut cm);
        assert_eq!(cm, before);
    }
}
