"""What gzip level 1 does to a List of Pods shaped like a real cluster's.

The bench's objects are padded with one repeated byte, so they compress
about 46x; real Pods do not. This builds a PodList of N Pods as a
Deployment's replicas look when read back from kube-apiserver (labels,
owner reference, one container with env, resources, probes and volume
mounts, managedFields, status with conditions and IPs; names, UIDs, IPs,
hashes and times differ per Pod), then reports its size, its size at gzip
level 1 (kube-apiserver's level, and watchcache's) and the time C zlib
takes. With --write FILE it also writes the PodList there, for
`bench/examples/gzip.rs` (the daemon's compressor: flate2 on zlib-rs).

    python3 docs/bench/gzip_pods.py [N] [--write FILE]
"""
import json
import random
import sys
import time
import uuid
import zlib

rng = random.Random(7)
args = sys.argv[1:]
out = None
if "--write" in args:
    i = args.index("--write")
    out = args[i + 1]
    del args[i:i + 2]
N = int(args[0]) if args else 10000


def ts():
    return "2026-11-%02dT%02d:%02d:%02dZ" % (rng.randint(1, 28), rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59))


def pod(i):
    app = "svc-%d" % (i % 40)
    rs = "%s-%08x" % (app, rng.getrandbits(32))
    name = "%s-%05x" % (rs, rng.getrandbits(20))
    ip = "10.%d.%d.%d" % (rng.randint(0, 255), rng.randint(0, 255), rng.randint(1, 254))
    node = "node-%03d" % rng.randint(0, 199)
    t = ts()
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "generateName": rs + "-", "namespace": "team-%d" % (i % 12),
            "uid": str(uuid.UUID(int=rng.getrandbits(128))), "resourceVersion": str(1000000 + i),
            "creationTimestamp": t,
            "labels": {"app": app, "pod-template-hash": rs.rsplit("-", 1)[1], "tier": "backend"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs,
                                 "uid": str(uuid.UUID(int=rng.getrandbits(128))), "controller": True, "blockOwnerDeletion": True}],
            "managedFields": [
                {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1", "time": t, "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}},
                                             "f:ownerReferences": {".": {}, "k:{\"uid\":\"x\"}": {}}},
                              "f:spec": {"f:containers": {"k:{\"name\":\"main\"}": {".": {}, "f:env": {}, "f:image": {}, "f:resources": {}}}}}},
                {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": ts(), "fieldsType": "FieldsV1", "subresource": "status",
                 "fieldsV1": {"f:status": {"f:conditions": {}, "f:containerStatuses": {}, "f:hostIP": {}, "f:podIP": {}, "f:startTime": {}}}},
            ],
        },
        "spec": {
            "containers": [{
                "name": "main", "image": "registry.example.com/%s:v1.%d.%d" % (app, i % 7, i % 13),
                "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                "env": [{"name": "SERVICE_NAME", "value": app}, {"name": "LOG_LEVEL", "value": "info"},
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}}],
                "resources": {"limits": {"cpu": "1", "memory": "512Mi"}, "requests": {"cpu": "100m", "memory": "128Mi"}},
                "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"}, "periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3},
                "volumeMounts": [{"name": "kube-api-access-%05x" % rng.getrandbits(20), "readOnly": True, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent",
            }],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "nodeName": node, "schedulerName": "default-scheduler",
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
        },
        "status": {
            "phase": "Running", "hostIP": "192.168.%d.%d" % (rng.randint(0, 9), rng.randint(1, 254)), "podIP": ip,
            "podIPs": [{"ip": ip}], "startTime": t, "qosClass": "Burstable",
            "conditions": [{"type": c, "status": "True", "lastProbeTime": None, "lastTransitionTime": ts()}
                           for c in ("Initialized", "Ready", "ContainersReady", "PodScheduled")],
            "containerStatuses": [{"name": "main", "ready": True, "restartCount": rng.choice([0, 0, 0, 1, 2]),
                                   "image": "registry.example.com/%s:v1" % app,
                                   "imageID": "registry.example.com/%s@sha256:%064x" % (app, rng.getrandbits(256)),
                                   "containerID": "containerd://%064x" % rng.getrandbits(256),
                                   "started": True, "state": {"running": {"startedAt": ts()}}}],
        },
    }


body = json.dumps({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "2000000"},
                   "items": [pod(i) for i in range(N)]}, separators=(",", ":")).encode()
runs = []
for _ in range(5):
    t = time.perf_counter()
    z = zlib.compressobj(1, zlib.DEFLATED, 31)  # 31: a gzip stream
    packed = z.compress(body) + z.flush()
    runs.append(time.perf_counter() - t)
ms = sorted(runs)[len(runs) // 2] * 1000
print("pods %d, JSON %.1f KiB (%.0f B per pod), gzip -1 %.1f KiB (%.1fx), %.1f ms (%.0f MB/s, median of 5; zlib %s)"
      % (N, len(body) / 1024, len(body) / N, len(packed) / 1024, len(body) / len(packed), ms, len(body) / ms / 1000, zlib.ZLIB_VERSION))
if out:
    with open(out, "wb") as f:
        f.write(body)
