//! The `kube` crate against the REST API: `Api<DynamicObject>` verbs and
//! `kube::runtime::watcher` (list+watch and streaming lists), including
//! re-watching across server-side watch timeouts.
mod common;
use common::server as api_support;

use std::time::Duration;

use futures::StreamExt;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams, VersionMatch,
};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde_json::json;

use api_support::TestServer;

fn client(ts: &TestServer) -> Client {
    let uri: hyper::Uri = ts.base().parse().expect("server URI");
    let config = kube::Config::new(uri);
    Client::try_from(config).expect("kube client")
}

fn pods_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Pod"), "pods")
}

fn widgets_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", "v1", "Widget"),
        "widgets",
    )
}

fn dyn_pod(name: &str) -> DynamicObject {
    let mut obj = DynamicObject::new(name, &pods_resource());
    obj.data =
        json!({"spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "nginx"}]}});
    obj
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_api_verbs() {
    let ts = TestServer::start("kube-verbs", |_| {}).await;
    let client = client(&ts);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "ns1", &pods_resource());

    // create
    let created = api
        .create(&PostParams::default(), &dyn_pod("k1"))
        .await
        .expect("create");
    assert_eq!(created.metadata.name.as_deref(), Some("k1"));
    assert_eq!(created.metadata.namespace.as_deref(), Some("ns1"));
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    let rv1: i64 = created
        .metadata
        .resource_version
        .as_deref()
        .and_then(|s| s.parse().ok())
        .expect("rv");
    // create conflict is a typed 409
    let err = api
        .create(&PostParams::default(), &dyn_pod("k1"))
        .await
        .expect_err("already exists");
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 409);
            assert_eq!(s.reason, "AlreadyExists");
        }
        other => panic!("want an API error, got {other:?}"),
    }

    // get
    let got = api.get("k1").await.expect("get");
    assert_eq!(
        got.metadata.resource_version,
        created.metadata.resource_version
    );
    assert_eq!(got.data["spec"]["nodeName"], "node-1");
    assert!(api.get_opt("missing").await.expect("get_opt").is_none());

    // list
    api.create(&PostParams::default(), &dyn_pod("k2"))
        .await
        .expect("create k2");
    let list = api.list(&ListParams::default()).await.expect("list");
    let names: Vec<_> = list
        .items
        .iter()
        .filter_map(|o| o.metadata.name.clone())
        .collect();
    assert_eq!(names, ["k1", "k2"]);
    assert!(list.metadata.resource_version.is_some());
    let paged = api
        .list(&ListParams::default().limit(1))
        .await
        .expect("paged list");
    assert_eq!(paged.items.len(), 1);
    assert!(paged.metadata.continue_.is_some());
    let selected = api
        .list(
            &ListParams::default()
                .fields("metadata.name=k2")
                .labels("app!=x"),
        )
        .await
        .expect("selected list");
    assert_eq!(selected.items.len(), 1);

    // replace
    let mut rep = got.clone();
    rep.data["spec"]["nodeName"] = json!("node-2");
    let replaced = api
        .replace("k1", &PostParams::default(), &rep)
        .await
        .expect("replace");
    assert_eq!(replaced.data["spec"]["nodeName"], "node-2");
    let rv2: i64 = replaced
        .metadata
        .resource_version
        .as_deref()
        .and_then(|s| s.parse().ok())
        .unwrap();
    assert!(rv2 > rv1);
    // replacing with the stale object conflicts
    let err = api
        .replace("k1", &PostParams::default(), &rep)
        .await
        .expect_err("stale replace");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 409 && s.reason == "Conflict"),
        "{err:?}"
    );

    // patch (merge, strategic merge; apply is refused)
    let patched = api
        .patch(
            "k1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"patched": "merge"}}})),
        )
        .await
        .expect("merge patch");
    assert_eq!(
        patched
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("patched"))
            .map(String::as_str),
        Some("merge")
    );
    let patched = api
        .patch(
            "k1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"nodeName": "node-3"}})),
        )
        .await
        .expect("strategic merge patch");
    assert_eq!(patched.data["spec"]["nodeName"], "node-3");
    // Server-side apply through kube's Patch::Apply: the label set and its
    // manager recorded; another manager's different value conflicts (409)
    // until forced.
    let applied = api
        .patch(
            "k1",
            &PatchParams::apply("test"),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "k1", "labels": {"owner": "test"}}})),
        )
        .await
        .expect("server-side apply");
    assert_eq!(
        applied
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("owner")),
        Some(&"test".to_string())
    );
    let managers: Vec<_> = applied
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|m| (m.manager.clone(), m.operation.clone()))
        .collect();
    assert_eq!(
        managers,
        [(Some("test".to_string()), Some("Apply".to_string()))]
    );
    let other = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "k1", "labels": {"owner": "other"}}});
    let err = api
        .patch("k1", &PatchParams::apply("other"), &Patch::Apply(&other))
        .await
        .expect_err("a conflict");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 409 && s.reason == "Conflict"),
        "{err:?}"
    );
    let forced = api
        .patch(
            "k1",
            &PatchParams::apply("other").force(),
            &Patch::Apply(&other),
        )
        .await
        .expect("forced apply");
    assert_eq!(
        forced.metadata.labels.as_ref().and_then(|l| l.get("owner")),
        Some(&"other".to_string())
    );

    // delete
    let deleted = api
        .delete("k1", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(deleted.left().is_some(), "the deleted object is returned");
    assert!(api.get_opt("k1").await.expect("get_opt").is_none());
    assert!(ts.etcd_get(&ts.pod_key("ns1", "k1")).await.is_none());

    // a non-core, namespaced resource through the same client
    let widgets: Api<DynamicObject> = Api::namespaced_with(client, "ns1", &widgets_resource());
    let mut w = DynamicObject::new("w1", &widgets_resource());
    w.data = json!({"spec": {"size": 3}});
    widgets
        .create(&PostParams::default(), &w)
        .await
        .expect("create widget");
    let all = widgets
        .list(&ListParams::default())
        .await
        .expect("list widgets");
    assert_eq!(all.items.len(), 1);
}

/// Drives a watcher until `pred` holds for an event, collecting the events.
async fn next_matching<S>(
    stream: &mut S,
    seen: &mut Vec<String>,
    timeout: Duration,
    pred: impl Fn(&Event<DynamicObject>) -> bool,
) -> bool
where
    S: futures::Stream<Item = Result<Event<DynamicObject>, watcher::Error>> + Unpin,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let next = match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(n) => n,
            Err(_) => return false,
        };
        match next {
            Some(Ok(ev)) => {
                seen.push(describe(&ev));
                if pred(&ev) {
                    return true;
                }
            }
            Some(Err(e)) => panic!("watcher error: {e} (events so far: {seen:?})"),
            None => return false,
        }
    }
}

fn describe(ev: &Event<DynamicObject>) -> String {
    let name = |o: &DynamicObject| o.metadata.name.clone().unwrap_or_default();
    match ev {
        Event::Apply(o) => format!("Apply({})", name(o)),
        Event::Delete(o) => format!("Delete({})", name(o)),
        Event::Init => "Init".into(),
        Event::InitApply(o) => format!("InitApply({})", name(o)),
        Event::InitDone => "InitDone".into(),
    }
}

fn is_apply_of(ev: &Event<DynamicObject>, n: &str) -> bool {
    matches!(ev, Event::Apply(o) if o.metadata.name.as_deref() == Some(n))
}

async fn watcher_survives_timeouts(streaming: bool) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let ts = TestServer::start(
        if streaming {
            "kube-watch-sl"
        } else {
            "kube-watch"
        },
        |_| {},
    )
    .await;
    let client = client(&ts);
    let api: Api<DynamicObject> = Api::namespaced_with(client, "ns1", &pods_resource());
    let existing = api
        .create(&PostParams::default(), &dyn_pod("existing"))
        .await
        .expect("create");
    // kube-rs opens a streaming list at resourceVersion=0 ("any"), which the
    // cache may serve before its reflector has seen this create, as
    // kube-apiserver's Cacher may. A List not older than the create's RV
    // waits until the cache holds it, so the initial events must include it.
    let created_rv = existing
        .metadata
        .resource_version
        .clone()
        .expect("created RV");
    let fresh = api
        .list(
            &ListParams::default()
                .at(&created_rv)
                .matching(VersionMatch::NotOlderThan),
        )
        .await
        .expect("list not older than the create");
    assert_eq!(fresh.items.len(), 1);
    let mut cfg = watcher::Config::default().timeout(1);
    if streaming {
        cfg = cfg.streaming_lists();
    }
    let mut stream = watcher::watcher(api.clone(), cfg).boxed();
    let mut seen = Vec::new();
    assert!(
        next_matching(
            &mut stream,
            &mut seen,
            Duration::from_secs(15),
            |e| matches!(e, Event::Init)
        )
        .await,
        "Init: {seen:?}"
    );
    assert!(
        next_matching(
            &mut stream,
            &mut seen,
            Duration::from_secs(15),
            |e| matches!(e, Event::InitDone)
        )
        .await,
        "InitDone: {seen:?}"
    );
    assert!(
        seen.contains(&"InitApply(existing)".to_string()),
        "{seen:?}"
    );

    // live events
    api.create(&PostParams::default(), &dyn_pod("live1"))
        .await
        .expect("create live1");
    assert!(
        next_matching(&mut stream, &mut seen, Duration::from_secs(15), |e| {
            is_apply_of(e, "live1")
        })
        .await,
        "live1: {seen:?}"
    );
    // Let several 1 s server-side watch timeouts pass; the watcher re-watches
    // from its last RV without errors (an error would panic in next_matching)
    // and without a relist.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    api.create(&PostParams::default(), &dyn_pod("live2"))
        .await
        .expect("create live2");
    assert!(
        next_matching(&mut stream, &mut seen, Duration::from_secs(15), |e| {
            is_apply_of(e, "live2")
        })
        .await,
        "live2 after timeouts: {seen:?}"
    );
    api.delete("live1", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(
        next_matching(&mut stream, &mut seen, Duration::from_secs(15), |e| {
            matches!(e, Event::Delete(o) if o.metadata.name.as_deref() == Some("live1"))
        })
        .await,
        "delete: {seen:?}"
    );
    let inits = seen.iter().filter(|s| *s == "Init").count();
    assert_eq!(inits, 1, "no relist across watch timeouts: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_watcher_list_watch_across_timeouts() {
    watcher_survives_timeouts(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_watcher_streaming_list_across_timeouts() {
    watcher_survives_timeouts(true).await;
}
