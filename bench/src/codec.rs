//! `codec`: what kube-apiserver's protobuf costs watchcache per object, with
//! no etcd and no daemon: the encoding of a cached object's JSON into its
//! typed message (a protobuf Get, List or watch event, once per object
//! change) and the decoding of a stored `k8s\0` value into the served JSON
//! (the reflector's ingest of a cluster that stores protobuf).

use std::time::Instant;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use watchcache::object::protobuf;

use crate::report::print_table;
use crate::wire::make_schema_pod;

/// A Pod as a real cluster holds it (a controller-made, scheduled, running
/// Pod with the usual metadata, one container with env, probes, mounts and
/// resources, status with conditions): about 3.6 KB of JSON.
pub fn realistic_pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": "default", "uid": "8f5e1c4e-6c1b-4f0e-9d55-1d8a2b7a3c11",
            "resourceVersion": "123456", "creationTimestamp": "2026-11-20T10:00:00Z",
            "generateName": "web-7d9f8b6c5-",
            "labels": {"app": "web", "pod-template-hash": "7d9f8b6c5", "tier": "frontend"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-20T09:59:00Z"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9f8b6c5",
                                  "uid": "0b7d2f1a-0000-4c4c-8c8c-1234567890ab", "controller": true, "blockOwnerDeletion": true}],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                               "time": "2026-11-20T10:00:00Z", "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}}}]
        },
        "spec": {
            "containers": [{
                "name": "web", "image": "registry.example.com/web:1.27.3",
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                "env": [{"name": "MODE", "value": "production"},
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}}],
                "resources": {"limits": {"cpu": "500m", "memory": "512Mi"}, "requests": {"cpu": "100m", "memory": "128Mi"}},
                "volumeMounts": [{"name": "kube-api-access-x7k2p", "readOnly": true,
                                  "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"},
                                  "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3},
                "readinessProbe": {"httpGet": {"path": "/ready", "port": "http", "scheme": "HTTP"},
                                   "timeoutSeconds": 1, "periodSeconds": 5, "successThreshold": 1, "failureThreshold": 3},
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent"
            }],
            "volumes": [{"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
            ]}}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "serviceAccount": "default", "nodeName": "node-17",
            "securityContext": {}, "schedulerName": "default-scheduler", "priority": 0,
            "enableServiceLinks": true, "preemptionPolicy": "PreemptLowerPriority",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            ]
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Initialized", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-11-20T10:00:01Z"},
                {"type": "Ready", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-11-20T10:00:09Z"},
                {"type": "ContainersReady", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-11-20T10:00:09Z"},
                {"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-11-20T10:00:00Z"}
            ],
            "hostIP": "10.0.3.17", "hostIPs": [{"ip": "10.0.3.17"}],
            "podIP": "10.244.17.23", "podIPs": [{"ip": "10.244.17.23"}],
            "startTime": "2026-11-20T10:00:01Z", "qosClass": "Burstable",
            "containerStatuses": [{
                "name": "web", "ready": true, "restartCount": 0, "started": true,
                "state": {"running": {"startedAt": "2026-11-20T10:00:03Z"}}, "lastState": {},
                "image": "registry.example.com/web:1.27.3",
                "imageID": "registry.example.com/web@sha256:4f1c2b9e8d7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c",
                "containerID": "containerd://5d0c6b8a9e7f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b"
            }]
        }
    })
}

/// An object shape: its label and how to make object `i`.
type Shape = (&'static str, Box<dyn Fn(usize) -> Value>);

/// Times `n` encodes and decodes of each object shape; prints a table and
/// returns the figures.
pub fn run(n: usize, size: usize) -> Result<Value> {
    let n = n.max(1);
    let shapes: [Shape; 2] = [
        (
            "bench pod",
            Box::new(move |i| {
                let name = format!("obj-{i:06}");
                serde_json::from_slice(&make_schema_pod("watchcache-bench", &name, size))
                    .unwrap_or(Value::Null)
            }),
        ),
        (
            "realistic pod",
            Box::new(|i| realistic_pod(&format!("web-7d9f8b6c5-{i:05}"))),
        ),
    ];
    let mut rows = Vec::new();
    let mut results = serde_json::Map::new();
    for (label, make) in &shapes {
        let wires: Vec<Vec<u8>> = (0..n)
            .map(|i| serde_json::to_vec(&make(i)))
            .collect::<Result<_, _>>()?;
        let stored: Vec<Vec<u8>> = wires
            .iter()
            .map(|w| {
                let v: Value = serde_json::from_slice(w)?;
                protobuf::encode(&v).with_context(|| format!("{label} does not fit the schema"))
            })
            .collect::<Result<_>>()?;
        // What a first protobuf read of a cached object does: parse its
        // JSON and encode the typed message.
        let t = Instant::now();
        let mut bytes = 0usize;
        for w in &wires {
            let v: Value = serde_json::from_slice(w)?;
            bytes += protobuf::encode_message(v, "v1", "Pod")?.len();
        }
        let encode_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        // What the reflector does with a stored protobuf value: the JSON
        // it serves, then the stored message with its resourceVersion,
        // kept for protobuf clients instead of the encode above.
        let t = Instant::now();
        let mut messages = Vec::with_capacity(n);
        for s in &stored {
            let (json, message) = protobuf::decode_stored(s)?;
            bytes += serde_json::to_vec(&json)?.len();
            messages.push(message);
        }
        let decode_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        let t = Instant::now();
        for (i, m) in messages.iter().enumerate() {
            let at = m
                .at(1_000_000 + i as i64)
                .with_context(|| format!("{label}: no metadata to set a resourceVersion in"))?;
            bytes += at.len();
        }
        let kept_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        let json_bytes = wires.iter().map(Vec::len).sum::<usize>() / n;
        let pb_bytes = stored.iter().map(Vec::len).sum::<usize>() / n;
        std::hint::black_box(bytes);
        rows.push(vec![
            label.to_string(),
            json_bytes.to_string(),
            pb_bytes.to_string(),
            format!("{encode_us:.1}"),
            format!("{decode_us:.1}"),
            format!("{kept_us:.2}"),
        ]);
        results.insert(
            label.replace(' ', "_"),
            json!({
                "objects": n,
                "json_bytes": json_bytes,
                "protobuf_bytes": pb_bytes,
                "encode_us_per_object": (encode_us * 10.0).round() / 10.0,
                "decode_us_per_object": (decode_us * 10.0).round() / 10.0,
                "stored_message_us_per_object": (kept_us * 100.0).round() / 100.0,
            }),
        );
    }
    print_table(
        "protobuf codec, per object (one thread)",
        &[
            "object",
            "JSON B",
            "protobuf B",
            "encode us",
            "decode us",
            "stored msg us",
        ],
        &rows,
    );
    Ok(Value::Object(results))
}
