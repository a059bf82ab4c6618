//! The etcd3 store against a real etcd (docs/DESIGN.md section 3).
mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{Value, json};
use watchcache::config::EtcdConfig;
use watchcache::storage::{
    EncryptionTransformer, ListOptions, Preconditions, Storage, StorageError, StoredObject,
    Transformer, UpdateAction, WatchItem, WriteOptions,
};

async fn storage_with(cfg: EtcdConfig) -> Storage {
    Storage::connect(&cfg).await.expect("connect")
}

/// A Storage on the shared etcd and a key prefix of its own.
async fn shared(name: &str) -> (Storage, String) {
    let prefix = common::unique_prefix(name);
    let s = storage_with(common::etcd_config(common::etcd(), &prefix)).await;
    (s, prefix)
}

async fn raw_client(endpoint: &str) -> etcd_client::Client {
    etcd_client::Client::connect([endpoint], None)
        .await
        .expect("raw client")
}

/// The value as etcd holds it, read behind the storage layer's back.
async fn raw_get(endpoint: &str, key: &str) -> Option<(Vec<u8>, i64)> {
    let mut c = raw_client(endpoint).await;
    let r = c.get(key, None).await.expect("raw get");
    r.kvs()
        .first()
        .map(|kv| (kv.value().to_vec(), kv.mod_revision()))
}

/// The two no-op updates: `Update` with the current value (no suggestion)
/// and `Unchanged` on `suggestion`; returns both results.
async fn noop_updates(
    s: &Storage,
    key: &str,
    suggestion: &StoredObject,
) -> (StoredObject, StoredObject) {
    let w = WriteOptions::default();
    let same = s
        .guaranteed_update(key, &Preconditions::none(), None, &w, |cur| {
            Ok::<_, StorageError>(UpdateAction::Update(cur.value.clone()))
        })
        .await
        .unwrap();
    let unchanged = s
        .guaranteed_update(
            key,
            &Preconditions::none(),
            Some(suggestion.clone()),
            &w,
            |_| Ok::<_, StorageError>(UpdateAction::Unchanged),
        )
        .await
        .unwrap();
    (same, unchanged)
}

fn obj(name: &str, uid: &str, n: i64) -> Bytes {
    Bytes::from(
        serde_json::to_vec(&json!({"metadata": {"name": name, "uid": uid}, "n": n})).expect("json"),
    )
}

fn counter(o: &StoredObject) -> i64 {
    let v: Value = serde_json::from_slice(&o.value).expect("stored json");
    v["n"].as_i64().expect("n")
}

fn with_counter(o: &StoredObject, n: i64) -> Bytes {
    let mut v: Value = serde_json::from_slice(&o.value).expect("stored json");
    v["n"] = json!(n);
    Bytes::from(serde_json::to_vec(&v).expect("json"))
}

#[tokio::test]
async fn create_existing_key_is_already_exists_and_value_unchanged() {
    let (s, p) = shared("create").await;
    let key = format!("{p}/a");
    let first = s
        .create(&key, obj("a", "u1", 1), &WriteOptions::default())
        .await
        .unwrap();
    assert!(first.mod_revision > 0);
    assert_eq!(first.create_revision, first.mod_revision);

    let err = s
        .create(&key, obj("a", "u2", 2), &WriteOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, StorageError::AlreadyExists { ref key } if key.ends_with("/a")),
        "{err:?}"
    );
    let (raw, rev) = raw_get(common::etcd(), &key).await.unwrap();
    assert_eq!(raw, obj("a", "u1", 1).to_vec());
    assert_eq!(rev, first.mod_revision);
    let got = s.get(&key, 0).await.unwrap();
    assert_eq!(got, first);
    assert!(
        s.get(&format!("{p}/missing"), 0)
            .await
            .unwrap_err()
            .is_not_found()
    );

    // Every etcd round trip is timed for /metrics.
    let text = watchcache::metrics::gather();
    for op in ["create", "get"] {
        assert!(
            text.contains(&format!(
                "watchcache_etcd_request_duration_seconds_count{{operation=\"{op}\"}}"
            )),
            "no duration recorded for {op}"
        );
    }
}

#[tokio::test]
async fn update_is_cas_on_mod_revision() {
    let (s, p) = shared("update").await;
    let key = format!("{p}/a");
    let w = WriteOptions::default();
    let v1 = s.create(&key, obj("a", "u", 1), &w).await.unwrap();
    let v2 = s
        .update(&key, obj("a", "u", 2), v1.mod_revision, &w)
        .await
        .unwrap();
    assert!(v2.mod_revision > v1.mod_revision);
    assert_eq!(v2.create_revision, v1.create_revision);
    assert_eq!(v2.version, 2);

    // Stale revision: Conflict, and etcd keeps v2.
    let err = s
        .update(&key, obj("a", "u", 3), v1.mod_revision, &w)
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err:?}");
    assert_eq!(s.get(&key, 0).await.unwrap(), v2);

    // Missing key: NotFound, even with expected revision 0 (no accidental create).
    let missing = format!("{p}/missing");
    let err = s
        .update(&missing, obj("m", "u", 1), 0, &w)
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err:?}");
    assert!(raw_get(common::etcd(), &missing).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_guaranteed_updates_lose_nothing() {
    let (s, p) = shared("gu-concurrent").await;
    let key = format!("{p}/counter");
    s.create(&key, obj("counter", "u", 0), &WriteOptions::default())
        .await
        .unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (s, key, calls) = (s.clone(), key.clone(), calls.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..100 {
                s.guaranteed_update(
                    &key,
                    &Preconditions::none(),
                    None,
                    &WriteOptions::default(),
                    |cur| {
                        calls.fetch_add(1, Ordering::Relaxed);
                        Ok::<_, StorageError>(UpdateAction::Update(with_counter(
                            cur,
                            counter(cur) + 1,
                        )))
                    },
                )
                .await
                .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let end = s.get(&key, 0).await.unwrap();
    assert_eq!(counter(&end), 800);
    assert_eq!(end.version, 801);
    let retries = s.conflict_retries();
    assert!(retries >= 1, "8 writers on one key never conflicted?");
    assert_eq!(
        calls.load(Ordering::Relaxed),
        800 + retries,
        "each conflict costs exactly one more call of the update fn"
    );
}

#[tokio::test]
async fn guaranteed_update_with_stale_suggestion_lands_on_current_value() {
    let (s, p) = shared("gu-stale").await;
    let key = format!("{p}/a");
    let w = WriteOptions::default();
    let stale = s.create(&key, obj("a", "u", 1), &w).await.unwrap();
    // Someone else moves the object to n=10 behind our back.
    let fresh = s
        .update(&key, obj("a", "u", 10), stale.mod_revision, &w)
        .await
        .unwrap();

    let mut seen = Vec::new();
    let out = s
        .guaranteed_update(
            &key,
            &Preconditions::none(),
            Some(stale.clone()),
            &w,
            |cur| {
                seen.push(counter(cur));
                Ok::<_, StorageError>(UpdateAction::Update(with_counter(cur, counter(cur) + 1)))
            },
        )
        .await
        .unwrap();
    assert_eq!(
        seen,
        vec![1, 10],
        "tried the suggestion, then the fresh state"
    );
    assert_eq!(counter(&out), 11);
    assert!(out.mod_revision > fresh.mod_revision);
    assert_eq!(counter(&s.get(&key, 0).await.unwrap()), 11);

    // A no-op decided on a stale suggestion is re-checked on fresh data: the
    // update fn "sets n=11", which equals the stale value only after re-read.
    let stale2 = StoredObject {
        value: with_counter(&out, 5),
        ..out.clone()
    };
    let s2 = s
        .update(&key, with_counter(&out, 12), out.mod_revision, &w)
        .await
        .unwrap();
    let r = s
        .guaranteed_update(&key, &Preconditions::none(), Some(stale2), &w, |_| {
            Ok::<_, StorageError>(UpdateAction::Unchanged)
        })
        .await
        .unwrap();
    assert_eq!(
        r, s2,
        "no-op returns the current object from etcd, not the suggestion"
    );
}

#[tokio::test]
async fn guaranteed_update_noop_does_not_bump_revision() {
    // A private etcd: the global revision must not move at all.
    let etcd = common::PrivateEtcd::start().await.expect("private etcd");
    let p = "/noop".to_string();
    let s = storage_with(common::etcd_config(&etcd.endpoint(), &p)).await;
    let key = format!("{p}/a");
    let w = WriteOptions::default();
    let created = s.create(&key, obj("a", "u", 1), &w).await.unwrap();
    let before = s.current_revision().await.unwrap();

    let (same, unchanged) = noop_updates(&s, &key, &created).await;
    assert_eq!(same, created);
    assert_eq!(unchanged, created);
    assert_eq!(s.current_revision().await.unwrap(), before);
    assert_eq!(
        s.get(&key, 0).await.unwrap().mod_revision,
        created.mod_revision
    );

    // Missing key -> NotFound, the update fn is never called.
    let err = s
        .guaranteed_update(
            &format!("{p}/missing"),
            &Preconditions::none(),
            None,
            &w,
            |_| -> Result<UpdateAction, StorageError> { panic!("called on a missing key") },
        )
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err:?}");
}

#[tokio::test]
async fn guaranteed_update_checks_preconditions() {
    let (s, p) = shared("gu-precond").await;
    let key = format!("{p}/a");
    let w = WriteOptions::default();
    let created = s.create(&key, obj("a", "u1", 1), &w).await.unwrap();
    let err = s
        .guaranteed_update(&key, &Preconditions::uid("other"), None, &w, |cur| {
            Ok::<_, StorageError>(UpdateAction::Update(with_counter(cur, 2)))
        })
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err:?}");
    assert_eq!(s.get(&key, 0).await.unwrap(), created);
    let ok = s
        .guaranteed_update(&key, &Preconditions::uid("u1"), None, &w, |cur| {
            Ok::<_, StorageError>(UpdateAction::Update(with_counter(cur, 2)))
        })
        .await
        .unwrap();
    assert_eq!(counter(&ok), 2);
}

#[tokio::test]
async fn delete_checks_preconditions_and_returns_the_deleted_object() {
    let (s, p) = shared("delete").await;
    let key = format!("{p}/a");
    let w = WriteOptions::default();
    let created = s.create(&key, obj("a", "u1", 1), &w).await.unwrap();

    let err = s
        .delete(&key, &Preconditions::uid("wrong"), &w)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StorageError::Conflict { message, .. } if message.contains("UID")),
        "{err:?}"
    );
    let err = s
        .delete(
            &key,
            &Preconditions::resource_version(created.mod_revision - 1),
            &w,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StorageError::Conflict { message, .. } if message.contains("ResourceVersion")),
        "{err:?}"
    );
    assert_eq!(s.get(&key, 0).await.unwrap(), created, "object intact");

    let deleted = s
        .delete(
            &key,
            &Preconditions {
                uid: Some("u1".into()),
                resource_version: Some(created.mod_revision),
            },
            &w,
        )
        .await
        .unwrap();
    // The object as it was, at the delete's own revision: there just
    // before it, gone at it.
    assert!(deleted.mod_revision > created.mod_revision);
    assert_eq!(
        StoredObject {
            mod_revision: created.mod_revision,
            ..deleted.clone()
        },
        created
    );
    let mut raw = raw_client(common::etcd()).await;
    let at = |rev| etcd_client::GetOptions::new().with_revision(rev);
    let before = raw
        .get(key.as_str(), Some(at(deleted.mod_revision - 1)))
        .await
        .unwrap();
    assert_eq!(before.kvs().len(), 1);
    let after = raw
        .get(key.as_str(), Some(at(deleted.mod_revision)))
        .await
        .unwrap();
    assert!(after.kvs().is_empty());
    assert!(raw_get(common::etcd(), &key).await.is_none());
    let err = s
        .delete(&key, &Preconditions::none(), &w)
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err:?}");
}

/// Identity transformer that, on the first read it sees, writes `next` to the
/// key behind the storage layer's back: it moves the object between a
/// delete's read and its CAS, deterministically.
struct WriteOnFirstRead {
    endpoint: String,
    next: Bytes,
    fired: std::sync::atomic::AtomicBool,
}

impl Transformer for WriteOnFirstRead {
    fn to_storage(&self, _key: &str, v: Bytes) -> Result<Bytes, StorageError> {
        Ok(v)
    }
    fn from_storage(&self, key: &str, v: Bytes) -> Result<Bytes, StorageError> {
        if !self.fired.swap(true, Ordering::SeqCst) {
            let (ep, key, next) = (self.endpoint.clone(), key.to_string(), self.next.to_vec());
            // Sync hook, async client: write from a thread with its own runtime.
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async {
                    let mut c = raw_client(&ep).await;
                    c.put(key, next, None).await.expect("sneaky put");
                });
            })
            .join()
            .expect("writer thread");
        }
        Ok(v)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_retries_when_object_moves_but_preconditions_hold() {
    let (s, p) = shared("delete-retry").await;
    let w = WriteOptions::default();

    // The object changes (same uid) between read and CAS: delete retries on
    // the fresh state and succeeds, returning what it actually deleted.
    let key = format!("{p}/a");
    s.create(&key, obj("a", "u1", 0), &w).await.unwrap();
    let deleter = s.clone().with_transformer(Arc::new(WriteOnFirstRead {
        endpoint: common::etcd().to_string(),
        next: obj("a", "u1", 42),
        fired: Default::default(),
    }));
    let before = s.conflict_retries();
    let deleted = deleter
        .delete(&key, &Preconditions::uid("u1"), &w)
        .await
        .unwrap();
    assert_eq!(counter(&deleted), 42, "returns the object it deleted");
    assert_eq!(s.conflict_retries() - before, 1, "exactly one CAS retry");
    assert!(raw_get(common::etcd(), &key).await.is_none());

    // The object is replaced by one with another uid meanwhile: the retry
    // re-checks the preconditions and refuses; the new object stays.
    let key = format!("{p}/b");
    s.create(&key, obj("b", "u1", 0), &w).await.unwrap();
    let deleter = s.clone().with_transformer(Arc::new(WriteOnFirstRead {
        endpoint: common::etcd().to_string(),
        next: obj("b", "u2", 0),
        fired: Default::default(),
    }));
    let err = deleter
        .delete(&key, &Preconditions::uid("u1"), &w)
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err:?}");
    let (raw, _) = raw_get(common::etcd(), &key).await.unwrap();
    assert_eq!(raw, obj("b", "u2", 0).to_vec());
}

#[tokio::test]
async fn paginated_list_stays_at_one_revision_while_writes_continue() {
    let (s, p) = shared("list").await;
    let w = WriteOptions::default();
    for i in 0..25 {
        s.create(&format!("{p}/k{i:03}"), obj("k", "u", i), &w)
            .await
            .unwrap();
    }
    // A key just outside the prefix must never show up.
    s.create(&format!("{p}0"), obj("x", "u", 0), &w)
        .await
        .unwrap();
    assert_eq!(s.count(&format!("{p}/")).await.unwrap(), 25);

    let prefix = format!("{p}/");
    let mut opts = ListOptions {
        revision: 0,
        limit: 10,
        start_key: None,
    };
    let first = s.list(&prefix, &opts).await.unwrap();
    assert_eq!(first.items.len(), 10);
    assert!(first.more);
    assert_eq!(first.remaining, 15);
    let list_rev = first.revision;
    assert!(list_rev >= first.items.iter().map(|o| o.mod_revision).max().unwrap());

    // Writes after the list revision: a change, a delete, a new key.
    s.update(&format!("{p}/k015"), obj("k", "u", 999), 0, &w)
        .await
        .unwrap_err();
    let k15 = s.get(&format!("{p}/k015"), 0).await.unwrap();
    s.update(
        &format!("{p}/k015"),
        obj("k", "u", 999),
        k15.mod_revision,
        &w,
    )
    .await
    .unwrap();
    s.delete(&format!("{p}/k020"), &Preconditions::none(), &w)
        .await
        .unwrap();
    s.create(&format!("{p}/k0125"), obj("k", "u", 7), &w)
        .await
        .unwrap();

    let mut items = first.items.clone();
    opts.revision = list_rev;
    opts.start_key = first.next_start_key.clone();
    loop {
        let page = s.list(&prefix, &opts).await.unwrap();
        assert_eq!(page.revision, list_rev);
        assert_eq!(
            page.remaining,
            25 - items.len() as i64 - page.items.len() as i64
        );
        items.extend(page.items);
        if !page.more {
            break;
        }
        opts.start_key = page.next_start_key;
    }
    let keys: Vec<String> = items.iter().map(|o| o.key.clone()).collect();
    let want: Vec<String> = (0..25).map(|i| format!("{p}/k{i:03}")).collect();
    assert_eq!(
        keys, want,
        "the snapshot at the list revision, in key order"
    );
    assert!(items.iter().all(|o| o.mod_revision <= list_rev));
    assert_eq!(
        counter(&items[15]),
        15,
        "change after the revision not seen"
    );

    // list_all at the old revision sees the same; at latest the new state.
    let paged = |revision| ListOptions {
        revision,
        limit: 7,
        start_key: None,
    };
    let all = s.list_all(&prefix, &paged(list_rev)).await.unwrap();
    assert_eq!(all.revision, list_rev);
    assert_eq!(all.items, items);
    let now = s.list_all(&prefix, &paged(0)).await.unwrap();
    assert!(now.revision > list_rev);
    assert_eq!(now.items.len(), 25);
    assert!(now.items.iter().any(|o| o.key.ends_with("/k0125")));

    // A start key outside the prefix is refused.
    let bad = ListOptions {
        start_key: Some("/elsewhere".into()),
        ..Default::default()
    };
    assert!(matches!(
        s.list(&prefix, &bad).await,
        Err(StorageError::InvalidObject(_))
    ));
}

#[tokio::test]
async fn unreadable_keys_are_skipped_not_fatal() {
    let (s, p) = shared("unreadable").await;
    let w = WriteOptions::default();
    let mut raw = raw_client(common::etcd()).await;
    // A non-UTF-8 key first (0x01 sorts before the others), alone on its
    // page, then readable keys.
    let mut bad = format!("{p}/").into_bytes();
    bad.extend_from_slice(&[0x01, 0xff]);
    common::etcd_put(&mut raw, bad, "{}").await;
    for name in ["a", "b", "c"] {
        s.create(&format!("{p}/{name}"), obj(name, "u", 1), &w)
            .await
            .unwrap();
    }
    let all = s
        .list_all(
            &format!("{p}/"),
            &ListOptions {
                limit: 1,
                ..Default::default()
            },
        )
        .await
        .expect("a bad key does not fail the list");
    let keys: Vec<&str> = all.items.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(
        keys,
        vec![format!("{p}/a"), format!("{p}/b"), format!("{p}/c")]
    );
    assert_eq!(all.unreadable.len(), 1, "{:?}", all.unreadable);
    assert!(matches!(
        all.unreadable[0].error,
        StorageError::InvalidObject(_)
    ));
}

#[tokio::test]
async fn list_and_get_at_compacted_revision_fail_with_compacted() {
    let etcd = common::PrivateEtcd::start().await.expect("private etcd");
    let ep = etcd.endpoint();
    let s = storage_with(common::etcd_config(&ep, "/c")).await;
    let w = WriteOptions::default();
    let a = s.create("/c/a", obj("a", "u", 1), &w).await.unwrap();
    let old = a.mod_revision;
    s.update("/c/a", obj("a", "u", 2), old, &w).await.unwrap();
    s.create("/c/b", obj("b", "u", 1), &w).await.unwrap();
    let now = s.current_revision().await.unwrap();
    let mut raw = raw_client(&ep).await;
    raw.compact(now, None).await.unwrap();

    let err = s
        .list(
            "/c/",
            &ListOptions {
                revision: old,
                limit: 1,
                start_key: None,
            },
        )
        .await
        .unwrap_err();
    assert_eq!(
        err,
        StorageError::Compacted {
            requested: old,
            compacted: now
        }
    );
    let err = s.get("/c/a", old).await.unwrap_err();
    assert!(matches!(err, StorageError::Compacted { requested, .. } if requested == old));
    // The compaction revision itself is still readable.
    let page = s
        .list(
            "/c/",
            &ListOptions {
                revision: now,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(page.items.len(), 2);
}

#[tokio::test]
async fn ttl_writes_share_leases_and_expire() {
    let prefix = common::unique_prefix("ttl");
    let cfg = EtcdConfig {
        lease_reuse_seconds: 2,
        ..common::etcd_config(common::etcd(), &prefix)
    };
    let s = storage_with(cfg).await;
    let w = WriteOptions::with_ttl(2);
    let started = Instant::now();
    // 4 concurrent writers x 25: concurrent first writes must share one grant.
    let mut tasks = Vec::new();
    for t in 0..4 {
        let (s, prefix, w) = (s.clone(), prefix.clone(), w.clone());
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..25 {
                let o = s
                    .create(&format!("{prefix}/k{t}-{i:03}"), obj("k", "u", i), &w)
                    .await
                    .unwrap();
                ids.push(o.lease);
            }
            ids
        }));
    }
    let mut leases = HashSet::new();
    for t in tasks {
        leases.extend(t.await.unwrap());
    }
    let took = started.elapsed();
    assert!(!leases.contains(&0), "a TTL write without a lease");
    // Within the 2 s reuse window: at most 2 leases. A very slow machine may
    // legitimately need one more lease per further window.
    let allowed = 2 + (took.as_millis() / 2_000) as usize;
    assert!(
        leases.len() <= allowed,
        "{} distinct leases for 100 writes in {took:?}",
        leases.len()
    );
    assert_eq!(s.lease_manager().granted() as usize, leases.len());
    // The etcd view agrees: every key is attached to one of those leases.
    let mut raw = raw_client(common::etcd()).await;
    let r = raw
        .get(
            prefix.as_str(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert_eq!(r.kvs().len(), 100);
    assert!(r.kvs().iter().all(|kv| leases.contains(&kv.lease())));

    // Keys vanish after ttl (+ at most the reuse window).
    let gone = common::eventually(Duration::from_secs(10), || {
        let s = s.clone();
        let p = format!("{prefix}/");
        async move { matches!(s.count(&p).await, Ok(0)) }
    })
    .await;
    assert!(gone, "keys outlived their lease");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "expired too early"
    );
}

#[tokio::test]
async fn dry_run_changes_nothing() {
    // A private etcd: the global revision must not move at all.
    let etcd = common::PrivateEtcd::start().await.expect("private etcd");
    let ep = etcd.endpoint();
    let p = "/dry".to_string();
    let s = storage_with(common::etcd_config(&ep, &p)).await;
    let key = format!("{p}/a");
    let w = WriteOptions::default();
    let dry = WriteOptions::dry_run();
    let rev0 = s.current_revision().await.unwrap();

    // Create: would-be object back, nothing written.
    let would = s.create(&key, obj("a", "u1", 1), &dry).await.unwrap();
    assert_eq!(would.value, obj("a", "u1", 1));
    assert!(raw_get(&ep, &key).await.is_none());
    assert_eq!(s.current_revision().await.unwrap(), rev0);

    let created = s.create(&key, obj("a", "u1", 1), &w).await.unwrap();
    let rev1 = s.current_revision().await.unwrap();
    // Dry-run create of an existing key still fails.
    assert!(matches!(
        s.create(&key, obj("a", "u1", 1), &dry).await,
        Err(StorageError::AlreadyExists { .. })
    ));

    // Update: CAS still checked; success returns the would-be object.
    let err = s
        .update(&key, obj("a", "u1", 2), created.mod_revision - 1, &dry)
        .await
        .unwrap_err();
    assert!(err.is_conflict());
    let u = s
        .update(&key, obj("a", "u1", 2), created.mod_revision, &dry)
        .await
        .unwrap();
    assert_eq!(counter(&u), 2);

    // GuaranteedUpdate: would-be object, nothing written.
    let g = s
        .guaranteed_update(&key, &Preconditions::none(), None, &dry, |cur| {
            Ok::<_, StorageError>(UpdateAction::Update(with_counter(cur, 3)))
        })
        .await
        .unwrap();
    assert_eq!(counter(&g), 3);
    let err = s
        .guaranteed_update(&key, &Preconditions::uid("nope"), None, &dry, |cur| {
            Ok::<_, StorageError>(UpdateAction::Update(with_counter(cur, 3)))
        })
        .await
        .unwrap_err();
    assert!(err.is_conflict());

    // Delete: preconditions checked; returns the object; it stays.
    assert!(
        s.delete(&key, &Preconditions::uid("nope"), &dry)
            .await
            .unwrap_err()
            .is_conflict()
    );
    let d = s
        .delete(&key, &Preconditions::uid("u1"), &dry)
        .await
        .unwrap();
    assert_eq!(d, created);
    assert!(
        s.delete(&format!("{p}/missing"), &Preconditions::none(), &dry)
            .await
            .unwrap_err()
            .is_not_found()
    );

    // TTL with dry-run grants no lease.
    let t = s
        .create(
            &format!("{p}/ttl"),
            obj("t", "u", 1),
            &WriteOptions {
                ttl_seconds: Some(30),
                dry_run: true,
            },
        )
        .await
        .unwrap();
    assert_eq!(t.lease, 0);
    assert_eq!(s.lease_manager().granted(), 0);

    assert_eq!(
        s.current_revision().await.unwrap(),
        rev1,
        "no write happened"
    );
    assert_eq!(s.get(&key, 0).await.unwrap(), created);
}

/// Reverses the bytes: enough to tell stored from plain values apart.
struct Reverse;
impl Transformer for Reverse {
    fn to_storage(&self, _key: &str, v: Bytes) -> Result<Bytes, StorageError> {
        Ok(v.iter().rev().copied().collect::<Vec<u8>>().into())
    }
    fn from_storage(&self, _key: &str, v: Bytes) -> Result<Bytes, StorageError> {
        Ok(v.iter().rev().copied().collect::<Vec<u8>>().into())
    }
}

#[tokio::test]
async fn transformer_applies_on_every_write_and_read() {
    let (s, p) = shared("transformer").await;
    let s = s.with_transformer(Arc::new(Reverse));
    let key = format!("{p}/a");
    let w = WriteOptions::default();
    let plain = obj("a", "u1", 1);
    let c = s.create(&key, plain.clone(), &w).await.unwrap();
    let (raw, _) = raw_get(common::etcd(), &key).await.unwrap();
    let reversed: Vec<u8> = plain.iter().rev().copied().collect();
    assert_eq!(raw, reversed);
    assert_eq!(s.get(&key, 0).await.unwrap().value, plain);
    let page = s
        .list(&format!("{p}/"), &ListOptions::default())
        .await
        .unwrap();
    assert_eq!(page.items[0].value, plain);
    // Preconditions see the plain JSON.
    let g = s
        .guaranteed_update(&key, &Preconditions::uid("u1"), Some(c), &w, |cur| {
            Ok::<_, StorageError>(UpdateAction::Update(with_counter(cur, 2)))
        })
        .await
        .unwrap();
    let (raw, _) = raw_get(common::etcd(), &key).await.unwrap();
    assert_eq!(raw, g.value.iter().rev().copied().collect::<Vec<u8>>());
    let d = s.delete(&key, &Preconditions::uid("u1"), &w).await.unwrap();
    assert_eq!(counter(&d), 2);
}

/// An `EncryptionConfiguration` for `secrets` with aesgcm keys in this
/// order (the first writes), over the storage's etcd prefix.
fn aesgcm_transformer(prefix: &str, keys: &[(&str, u8)]) -> Arc<EncryptionTransformer> {
    use base64::Engine;
    let providers: String = keys
        .iter()
        .map(|(name, byte)| {
            let secret = base64::engine::general_purpose::STANDARD.encode([*byte; 32]);
            format!("      - aesgcm:\n          keys:\n            - name: {name}\n              secret: {secret}\n")
        })
        .collect();
    let text = format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n  - resources: [secrets]\n    providers:\n{providers}"
    );
    let mut secrets = common::pods_resource(10);
    secrets.kind = "Secret".into();
    secrets.plural = "secrets".into();
    secrets.indexes.clear();
    Arc::new(EncryptionTransformer::parse(&text, "enc.yaml", &[secrets], prefix).expect("config"))
}

/// Key rotation as kube-apiserver does it: after the config puts key2 first,
/// a no-op update of a value stored under key1 rewrites it under key2 (the
/// read reported it stale); a no-op on a current value still writes nothing.
#[tokio::test]
async fn noop_update_rewrites_a_value_stored_with_a_stale_key() {
    let (plain, p) = shared("stale-key").await;
    let key = format!("{p}/secrets/ns/a");
    let w = WriteOptions::default();
    let key1 = plain
        .clone()
        .with_transformer(aesgcm_transformer(&p, &[("key1", 1)]));
    let created = key1.create(&key, obj("a", "u", 1), &w).await.unwrap();
    let (raw, _) = raw_get(common::etcd(), &key).await.unwrap();
    assert!(raw.starts_with(b"k8s:enc:aesgcm:v1:key1:"), "{raw:?}");

    // Rotated config: key2 writes, key1 still reads.
    let rotated = plain.with_transformer(aesgcm_transformer(&p, &[("key2", 2), ("key1", 1)]));
    assert_eq!(rotated.get(&key, 0).await.unwrap().value, created.value);
    // A no-op from a cached suggestion: re-read, found stale, rewritten.
    let rewritten = rotated
        .guaranteed_update(
            &key,
            &Preconditions::none(),
            Some(created.clone()),
            &w,
            |_| Ok::<_, StorageError>(UpdateAction::Unchanged),
        )
        .await
        .unwrap();
    assert!(rewritten.mod_revision > created.mod_revision);
    assert_eq!(rewritten.value, created.value, "same content, new key");
    let (raw, rev) = raw_get(common::etcd(), &key).await.unwrap();
    assert!(raw.starts_with(b"k8s:enc:aesgcm:v1:key2:"), "{raw:?}");
    assert_eq!(rev, rewritten.mod_revision);

    // Now current: no-op updates (without and with a suggestion) write nothing.
    let (same, unchanged) = noop_updates(&rotated, &key, &rewritten).await;
    assert_eq!(same, rewritten);
    assert_eq!(unchanged, rewritten);
    let (raw2, rev2) = raw_get(common::etcd(), &key).await.unwrap();
    assert_eq!(rev2, rewritten.mod_revision, "no write on a current value");
    assert_eq!(raw2, raw);

    // A stale value and a dry run: nothing is written.
    let moved = key1
        .update(&key, obj("a", "u", 2), rewritten.mod_revision, &w)
        .await
        .unwrap();
    let dry = rotated
        .guaranteed_update(
            &key,
            &Preconditions::none(),
            None,
            &WriteOptions {
                dry_run: true,
                ..WriteOptions::default()
            },
            |_| Ok::<_, StorageError>(UpdateAction::Unchanged),
        )
        .await
        .unwrap();
    assert_eq!(dry.mod_revision, moved.mod_revision);
    let (raw, _) = raw_get(common::etcd(), &key).await.unwrap();
    assert!(raw.starts_with(b"k8s:enc:aesgcm:v1:key1:"), "{raw:?}");
}

#[tokio::test]
async fn stopped_etcd_fails_within_the_deadline() {
    let mut etcd = common::PrivateEtcd::start().await.expect("private etcd");
    let cfg = EtcdConfig {
        request_timeout_ms: 1_000,
        dial_timeout_ms: 500,
        ..common::etcd_config(&etcd.endpoint(), "/down")
    };
    let s = storage_with(cfg).await;
    let w = WriteOptions::default();
    let a = s.create("/down/a", obj("a", "u", 1), &w).await.unwrap();
    etcd.kill();

    let limit = Duration::from_millis(1_000 + 1_500);
    let check = |what: &str, r: Result<(), StorageError>, took: Duration| {
        let err = r.expect_err(what);
        eprintln!("{what}: {err} after {took:?}");
        assert!(err.is_transient(), "{what}: {err:?}");
        assert!(took < limit, "{what} took {took:?}");
    };
    let t = Instant::now();
    let r = s.get("/down/a", 0).await.map(|_| ());
    check("get", r, t.elapsed());
    let t = Instant::now();
    let r = s.current_revision().await.map(|_| ());
    check("current_revision", r, t.elapsed());
    let t = Instant::now();
    let r = s.list("/down/", &ListOptions::default()).await.map(|_| ());
    check("list", r, t.elapsed());
    let t = Instant::now();
    let r = s.create("/down/b", obj("b", "u", 1), &w).await.map(|_| ());
    check("create", r, t.elapsed());
    let t = Instant::now();
    let r = s
        .update("/down/a", obj("a", "u", 2), a.mod_revision, &w)
        .await
        .map(|_| ());
    check("update", r, t.elapsed());
    let t = Instant::now();
    let r = s
        .guaranteed_update(
            "/down/a",
            &Preconditions::none(),
            Some(a.clone()),
            &w,
            |cur| Ok::<_, StorageError>(UpdateAction::Update(with_counter(cur, 5))),
        )
        .await
        .map(|_| ());
    check("guaranteed_update", r, t.elapsed());
    let t = Instant::now();
    let r = s
        .delete("/down/a", &Preconditions::none(), &w)
        .await
        .map(|_| ());
    check("delete", r, t.elapsed());
    let t = Instant::now();
    let r = s
        .create("/down/c", obj("c", "u", 1), &WriteOptions::with_ttl(5))
        .await
        .map(|_| ());
    check("create with ttl (lease grant)", r, t.elapsed());

    // A Storage connected while etcd is down also fails in time, not hangs.
    let t = Instant::now();
    let s2 = Storage::connect(&EtcdConfig {
        request_timeout_ms: 1_000,
        dial_timeout_ms: 500,
        ..common::etcd_config(&etcd.endpoint(), "/down")
    })
    .await;
    // (The connection is lazy, so `connect` itself succeeds; if it ever
    // failed instead, it must fail in time as well.)
    let r = match s2 {
        Ok(s2) => s2.get("/down/a", 0).await.map(|_| ()),
        Err(e) => Err(e),
    };
    check("get on a fresh connection", r, t.elapsed());

    // And recovers once etcd is back.
    etcd.restart().await.expect("restart");
    let back = common::eventually(Duration::from_secs(15), || {
        let s = s.clone();
        async move { s.get("/down/a", 0).await.is_ok() }
    })
    .await;
    assert!(back, "storage did not recover after etcd restarted");
}

/// Stops (SIGSTOP) the process on drop's opposite: resumes it when dropped, so
/// a failing assertion never leaves a frozen etcd behind.
struct Frozen(u32);
impl Frozen {
    /// Stops `pid` and waits until the kernel reports it stopped (state `T`
    /// in /proc): SIGSTOP is delivered asynchronously, and on a loaded
    /// machine etcd could otherwise still answer the next request.
    fn new(pid: u32) -> Frozen {
        // SAFETY: kill(2) on the pid of the etcd this test started.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGSTOP);
        }
        let stopped = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|st| st.rsplit_once(") ").map(|(_, rest)| rest.starts_with('T')))
                .unwrap_or(false)
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !stopped() {
            assert!(Instant::now() < deadline, "etcd {pid} did not stop");
            std::thread::sleep(Duration::from_millis(5));
        }
        Frozen(pid)
    }
}
impl Drop for Frozen {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe {
            libc::kill(self.0 as libc::pid_t, libc::SIGCONT);
        }
    }
}

/// A member of a cluster that has lost its leader (the other two members are
/// gone, as when it is cut off them) ends a watch and refuses a read with
/// etcd's "no leader": the daemon's requests carry etcd's require-leader
/// metadata, so its reflector opens the watch again, and a read is retried,
/// on another member. Without the metadata etcd keeps such a watch open and
/// silent, and holds the read until its deadline (a Timeout).
#[tokio::test]
async fn a_member_without_a_leader_ends_watches_and_refuses_reads() {
    let mut cluster = common::EtcdCluster::start().await;
    let s = storage_with(common::etcd_config(&cluster.endpoint(0), "/leaderless")).await;
    let w = WriteOptions::default();
    let a = s
        .create("/leaderless/a", obj("a", "u", 1), &w)
        .await
        .unwrap();
    let mut watch = s.watch("/leaderless/", a.mod_revision).await.unwrap();
    match watch.next().await.unwrap() {
        WatchItem::Events { revision, .. } => assert_eq!(revision, a.mod_revision),
        other => panic!("expected the create, got {other:?}"),
    }
    cluster.kill(1);
    cluster.kill(2);
    // etcd ends it after about three election timeouts (3 s) without a
    // leader; the bound only keeps a broken build from hanging the suite.
    let ended = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if let Err(e) = watch.next().await {
                return e;
            }
        }
    })
    .await
    .expect("the watch ended");
    assert!(
        matches!(&ended, StorageError::Unavailable(m) if m.contains("no leader")),
        "{ended:?}"
    );
    let read = s.current_revision().await.expect_err("no leader, no read");
    assert!(
        matches!(&read, StorageError::Unavailable(m) if m.contains("no leader")),
        "{read:?}"
    );
}

#[tokio::test]
async fn frozen_etcd_times_out_instead_of_hanging() {
    let etcd = common::PrivateEtcd::start().await.expect("private etcd");
    let cfg = EtcdConfig {
        request_timeout_ms: 800,
        dial_timeout_ms: 500,
        ..common::etcd_config(&etcd.endpoint(), "/frozen")
    };
    let s = storage_with(cfg).await;
    let w = WriteOptions::default();
    // Set up with a generous deadline: a loaded machine must not fail the
    // setup; only the calls against the frozen etcd test the short one.
    let setup = storage_with(EtcdConfig {
        request_timeout_ms: 10_000,
        ..common::etcd_config(&etcd.endpoint(), "/frozen")
    })
    .await;
    let a = setup
        .create("/frozen/a", obj("a", "u", 1), &w)
        .await
        .unwrap();
    let frozen = Frozen::new(etcd.pid().expect("etcd pid"));

    // The connection is up but nobody answers: only our deadline ends it.
    let limit = Duration::from_millis(800 + 1_200);
    let t = Instant::now();
    let err = s.get("/frozen/a", 0).await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    assert!(t.elapsed() < limit, "get took {:?}", t.elapsed());
    let t = Instant::now();
    let err = s
        .update("/frozen/a", obj("a", "u", 2), a.mod_revision, &w)
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    assert!(t.elapsed() < limit, "update took {:?}", t.elapsed());
    let t = Instant::now();
    let err = s
        .guaranteed_update(&a.key, &Preconditions::none(), None, &w, |cur| {
            Ok::<_, StorageError>(UpdateAction::Update(with_counter(cur, 3)))
        })
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    assert!(
        t.elapsed() < limit,
        "guaranteed_update took {:?}",
        t.elapsed()
    );

    drop(frozen);
    let back = common::eventually(Duration::from_secs(10), || {
        let s = s.clone();
        async move { s.get("/frozen/a", 0).await.is_ok() }
    })
    .await;
    assert!(back, "storage did not recover after etcd resumed");
}

/// A list page larger than gRPC's default 4 MiB decode limit (the reflector's
/// first page of many large objects) is read, not refused.
#[tokio::test]
async fn list_pages_larger_than_4_mib_are_read() {
    let (s, prefix) = shared("big_page").await;
    let pad = "x".repeat(900 * 1024);
    for i in 0..6 {
        let v = json!({"metadata": {"name": format!("big{i}")}, "pad": pad}).to_string();
        s.create(
            &format!("{prefix}/big{i}"),
            Bytes::from(v),
            &WriteOptions::default(),
        )
        .await
        .expect("create");
    }
    let page = s
        .list(&format!("{prefix}/"), &ListOptions::default())
        .await
        .expect("a ~5.4 MiB page");
    assert_eq!(page.items.len(), 6);
    assert!(page.items.iter().map(|o| o.value.len()).sum::<usize>() > 5 * 1024 * 1024);
}

/// The caches watch etcd without `prev_kv` (they hold every previous value
/// themselves; etcd's look-up of it is a large part of its cost per event):
/// a raw watch carries previous values only when asked for them.
#[tokio::test]
async fn raw_watch_asks_for_prev_kv_only_when_told() {
    use watchcache::storage::RawWatchItem;
    let (s, prefix) = shared("rawprev").await;
    let key = format!("{prefix}/k");
    let mut etcd = raw_client(common::etcd()).await;
    let first = etcd
        .put(key.as_str(), "one", None)
        .await
        .expect("put")
        .header()
        .expect("header")
        .revision();
    etcd.put(key.as_str(), "two", None).await.expect("put");
    let end = format!("{prefix}0");
    for with_prev in [false, true] {
        let mut w = s
            .watch_raw(key.as_bytes(), end.as_bytes(), first + 1, with_prev)
            .await
            .expect("watch");
        let events = loop {
            match tokio::time::timeout(Duration::from_secs(10), w.next())
                .await
                .expect("an event within 10 s")
                .expect("watch item")
            {
                RawWatchItem::Events { events, .. } => break events,
                RawWatchItem::Progress { .. } => continue,
            }
        };
        assert_eq!(events.len(), 1);
        let prev = events[0].prev_kv.as_ref().map(|kv| kv.value.clone());
        if with_prev {
            assert_eq!(prev, Some(b"one".to_vec()));
        } else {
            assert_eq!(prev, None, "no prev_kv unless asked for");
        }
    }
}
