//! The harness itself: the shared etcd answers, private etcds restart on their data dir.
mod common;

use std::time::Duration;

#[tokio::test]
async fn shared_etcd_answers_and_private_etcd_restarts() {
    let mut client = etcd_client::Client::connect([common::etcd()], None)
        .await
        .unwrap();
    let key = format!("{}/k", common::unique_prefix("harness"));
    client.put(key.as_str(), "v", None).await.unwrap();
    let got = client.get(key.as_str(), None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), b"v");

    let mut private = common::PrivateEtcd::start().await.unwrap();
    let mut c2 = etcd_client::Client::connect([private.endpoint()], None)
        .await
        .unwrap();
    c2.put("a", "1", None).await.unwrap();
    private.kill();
    private.restart().await.unwrap();
    let ok = common::eventually(Duration::from_secs(10), || {
        let ep = private.endpoint();
        async move {
            match etcd_client::Client::connect([ep], None).await {
                Ok(mut c) => matches!(c.get("a", None).await, Ok(r) if r.kvs().len() == 1),
                Err(_) => false,
            }
        }
    })
    .await;
    assert!(ok, "data survived the restart on the same data dir");
}
