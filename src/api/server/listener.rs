//! The REST API's server: [`Server::new`] makes the shared [`State`]
//! (one [`Cacher`] per configured resource) and starts the background
//! tasks; [`Server::serve`] accepts connections (HTTP/1.1 and h2c with
//! prior knowledge on one port, or TLS) up to `server.max_connections`
//! until the shutdown future resolves, then stops accepting, shuts every
//! cacher down (which ends open watch streams), lets in-flight requests
//! finish and returns within 5 s.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use super::background;
use super::connection::{self, ConnectionLimits};
use crate::api::security::{Security, SecurityError};
use crate::api::state::State;
use crate::cacher::Cacher;
use crate::config::Config;
use crate::storage::Storage;

/// How long [`Server::serve`] waits for connections to drain after shutdown.
const DRAIN_TIMEOUT: Duration = Duration::from_millis(4_000);

/// Errors of the server itself (request errors are `Status` responses).
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Security(#[from] SecurityError),
}

/// The HTTP server.
pub struct Server {
    state: Arc<State>,
}

impl Server {
    /// Reads the security files the config names (TLS certificates, client
    /// CA, token file, RBAC policy) and starts one [`Cacher`] per configured
    /// resource. Must be called inside a tokio runtime.
    pub fn new(config: Config, storage: Storage) -> Result<Server, ApiError> {
        let security = Security::from_config(&config.server)?;
        Ok(Server::with_security(config, storage, security))
    }

    /// [`Server::new`] with the security files already read (the daemon
    /// reads them before it connects anywhere, so a bad one stops start-up
    /// at once).
    pub fn with_security(config: Config, storage: Storage, security: Security) -> Server {
        let server = Server {
            state: Arc::new(State::new(config, storage, security)),
        };
        tokio::spawn(background::probe_etcd(Arc::clone(&server.state)));
        tokio::spawn(background::sweep_list_bodies(Arc::clone(&server.state)));
        tokio::spawn(background::sweep_watch_streams(
            Arc::clone(&server.state.watch_streams),
            server.state.shutdown.clone(),
        ));
        server
    }

    /// The shared state (config, storage, cachers).
    pub fn state(&self) -> &Arc<State> {
        &self.state
    }

    /// The cachers, one per configured resource, in config order.
    pub fn cachers(&self) -> Vec<Arc<Cacher>> {
        self.state
            .resources
            .iter()
            .map(|r| Arc::clone(&r.cacher))
            .collect()
    }

    /// Serves connections from `listener` until `shutdown` resolves.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ApiError> {
        let state = self.state;

        let limits = ConnectionLimits::from_config(&state.config.server);
        let conn_slots = Arc::new(Semaphore::new(
            state
                .config
                .server
                .max_connections
                .min(Semaphore::MAX_PERMITS),
        ));
        let (close_tx, close_rx) = tokio::sync::watch::channel(false);
        let mut conns = JoinSet::new();
        let mut shutdown = std::pin::pin!(shutdown);
        let tls = state.security.tls.clone();
        if let Ok(addr) = listener.local_addr() {
            match &tls {
                Some(_) => info!(%addr, "serving the REST API over TLS"),
                None if addr.ip().is_loopback() => info!(%addr, "serving the REST API"),
                None => warn!(
                    %addr,
                    "serving the REST API over plain HTTP on a non-loopback address: anyone who can reach it can read and write through it; set --tls-cert-file and --tls-private-key-file"
                ),
            }
        }
        if let Some(t) = &tls {
            tokio::spawn(crate::tls::watch_files(
                Arc::clone(&t.cert),
                state.shutdown.clone(),
            ));
        }
        let acceptor = tls
            .as_ref()
            .map(|t| tokio_rustls::TlsAcceptor::from(Arc::clone(&t.config)));
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                accepted = listener.accept() => {
                    let (stream, peer) = match accepted {
                        Ok(x) => x,
                        Err(e) => {
                            // EMFILE and friends: back off instead of spinning.
                            warn!(error = %e, "accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let Ok(permit) = Arc::clone(&conn_slots).try_acquire_owned() else {
                        // At the cap: close at once, so the connections
                        // already open (and /readyz) keep working.
                        crate::metrics::metrics().api_connections_refused.inc();
                        debug!(%peer, "connection refused: server.max_connections open");
                        drop(stream);
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&TCP_KEEPALIVE);
                    conns.spawn(connection::serve(
                        stream,
                        peer,
                        Arc::clone(&state),
                        limits,
                        acceptor.clone(),
                        close_rx.clone(),
                        permit,
                    ));
                }
            }
        }

        info!("shutting down: no new connections; ending watches");
        drop(listener);
        state.shutdown.cancel();
        for r in &state.resources {
            r.cacher.shutdown();
        }
        let _ = close_tx.send(true);
        let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
            while conns.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            warn!(
                open = conns.len(),
                "connections still open after the drain timeout; closing them"
            );
            conns.abort_all();
        }
        Ok(())
    }
}

/// TCP keep-alive of accepted connections: Go's net/http defaults (15 s
/// idle, then probes every 15 s; the kernel gives up after 9).
const TCP_KEEPALIVE: socket2::TcpKeepalive = socket2::TcpKeepalive::new()
    .with_time(Duration::from_secs(15))
    .with_interval(Duration::from_secs(15));
