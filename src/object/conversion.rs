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
/// (`api_version`, `kind`) in place. Other types are left as they are. A
/// Secret whose `data` or `stringData` is not a map of strings is refused
/// with the message kube-apiserver's decoder gives (a 400), and left as it
/// was.
pub fn convert_for_storage(
    api_version: &str,
    kind: &str,
    object: &mut Value,
) -> Result<(), String> {
    if converts(api_version, kind) {
        secret(object)?;
    }
    Ok(())
}

fn secret(object: &mut Value) -> Result<(), String> {
    let Some(o) = object.as_object_mut() else {
        return Ok(());
    };
    let refused = |field: &str, v: &Value| {
        let what = match v {
            Value::Bool(_) => "bool",
            Value::Number(_) => "number",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
            _ => "string",
        };
        format!(
            "Secret in version \"v1\" cannot be handled as a Secret: json: cannot unmarshal \
             {what} into Go struct field Secret.{field} of type string"
        )
    };
    let string_data = match o.get("stringData") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => {
            // A null value is Go's empty string.
            if let Some(v) = m.values().find(|v| !(v.is_string() || v.is_null())) {
                return Err(refused("stringData", v));
            }
            Some(m.clone())
        }
        Some(v) => {
            return Err(format!(
                "Secret in version \"v1\" cannot be handled as a Secret: json: cannot unmarshal \
                 {} into Go struct field Secret.stringData of type map[string]string",
                if v.is_array() { "array" } else { "value" }
            ));
        }
    };
    if let Some(string_data) = string_data {
        let data = match o.get_mut("data") {
            None | Some(Value::Null) => {
                o.insert("data".into(), Value::Object(Map::new()));
                o.get_mut("data")
            }
            d => d,
        };
        let Some(Value::Object(data)) = data else {
            return Err(
                "Secret in version \"v1\" cannot be handled as a Secret: json: cannot unmarshal \
                 value into Go struct field Secret.data of type map[string][]uint8"
                    .into(),
            );
        };
        for (k, v) in string_data {
            let s = v.as_str().unwrap_or_default();
            let encoded = base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
            data.insert(k, Value::String(encoded));
        }
        o.remove("stringData");
    }
    let untyped = match o.get("type") {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.is_empty(),
        Some(_) => false,
    };
    if untyped {
        o.insert("type".into(), Value::String("Opaque".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn secret_string_data_is_merged_into_data_and_wins() {
        let mut s = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
            "data": {"a": "b2xk", "keep": "eA=="}, "stringData": {"a": "new", "b": "t0p"}});
        convert_for_storage("v1", "Secret", &mut s).unwrap();
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
        convert_for_storage("v1", "Secret", &mut s).unwrap();
        assert_eq!(
            s,
            json!({"kind": "Secret", "type": "kubernetes.io/tls", "data": {"x": "eQ=="}})
        );
        let mut cm = json!({"kind": "ConfigMap", "stringData": {"x": "y"}});
        let before = cm.clone();
        convert_for_storage("v1", "ConfigMap", &mut cm).unwrap();
        assert_eq!(cm, before);
    }

    #[test]
    fn a_secret_that_is_not_a_map_of_strings_is_refused_and_kept() {
        let mut s = json!({"kind": "Secret", "stringData": {"a": 1}});
        let before = s.clone();
        let e = convert_for_storage("v1", "Secret", &mut s).unwrap_err();
        assert!(
            e.ends_with(
                "cannot unmarshal number into Go struct field Secret.stringData of type string"
            ),
            "{e}"
        );
        assert_eq!(s, before, "nothing is lost");
        let mut s = json!({"kind": "Secret", "data": "x", "stringData": {"a": "b"}});
        let before = s.clone();
        assert!(convert_for_storage("v1", "Secret", &mut s).is_err());
        assert_eq!(s, before);
    }
}
