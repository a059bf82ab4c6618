//! watchcache's etcd gRPC front on a free loopback port, for the tests of
//! etcd clients against it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::Client;
use tokio::sync::oneshot;

use watchcache::config::Config;
use watchcache::grpc::{Front, GrpcServer};
use watchcache::storage::Storage;

const WAIT: Duration = Duration::from_secs(20);

/// The gRPC front over `endpoint`, resources under `prefix`; shut down on drop.
pub struct TestFront {
    pub addr: SocketAddr,
    pub front: Arc<Front>,
    shutdown: Option<oneshot::Sender<()>>,
}

impl TestFront {
    /// Started with `common::server::test_config` as `tweak` changes it,
    /// once its raw caches are ready.
    pub async fn start(endpoint: &str, prefix: &str, tweak: impl FnOnce(&mut Config)) -> TestFront {
        let mut cfg = super::server::test_config(endpoint, prefix);
        tweak(&mut cfg);
        let storage = Storage::connect(&cfg.etcd).await.expect("connect");
        let server = GrpcServer::new(&cfg, storage);
        let front = Arc::clone(server.front());
        assert!(front.wait_ready(WAIT).await, "raw caches ready");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(server.serve(listener, async move {
            let _ = rx.await;
        }));
        TestFront {
            addr,
            front,
            shutdown: Some(tx),
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn client(&self) -> Client {
        Client::connect([self.endpoint()], None)
            .await
            .expect("client of the front")
    }

    /// Waits until every raw cache reached `rev`.
    pub async fn wait_rev(&self, rev: i64) {
        let front = Arc::clone(&self.front);
        let ok = super::eventually(WAIT, || {
            let front = Arc::clone(&front);
            async move { front.caches().iter().all(|c| c.revision() >= rev) }
        })
        .await;
        assert!(ok, "raw caches reached revision {rev}");
    }
}

impl Drop for TestFront {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}
