//! The TCP proxy between the daemon and etcd, so the bench can take etcd
//! away from the daemon alone: `cut` resets every connection and refuses new
//! ones (etcd is down for the daemon); `blackhole` keeps connections open but
//! moves no bytes (a partition: the daemon hears nothing until its own
//! timeouts fire); `forward` restores the path (blackholed connections are
//! then reset, as after a real partition their streams are stale).

use std::net::SocketAddr;

use anyhow::{Context, Result};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Forward,
    Cut,
    Blackhole,
}

pub struct TcpProxy {
    pub addr: SocketAddr,
    mode: watch::Sender<Mode>,
    task: JoinHandle<()>,
}

impl TcpProxy {
    /// Listens on a free loopback port and forwards to `target`.
    pub async fn start(target: SocketAddr) -> Result<TcpProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the chaos proxy")?;
        let addr = listener.local_addr()?;
        let (mode, _) = watch::channel(Mode::Forward);
        let modes = mode.clone();
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let mut rx = modes.subscribe();
                let m = *rx.borrow_and_update();
                tokio::spawn(async move {
                    match m {
                        Mode::Cut => {} // dropped: the client sees a reset
                        Mode::Blackhole => {
                            // Hold the connection silently until the mode changes.
                            let _held = inbound;
                            let _ = rx.changed().await;
                        }
                        Mode::Forward => forward(inbound, target, rx).await,
                    }
                });
            }
        });
        Ok(TcpProxy { addr, mode, task })
    }

    /// The URL to give the daemon as its etcd endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set(&self, m: Mode) {
        self.mode.send_replace(m);
    }
}

async fn forward(mut inbound: TcpStream, target: SocketAddr, mut rx: watch::Receiver<Mode>) {
    let Ok(mut outbound) = TcpStream::connect(target).await else {
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let changed = tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => return,
        m = rx.wait_for(|m| *m != Mode::Forward) => m.map(|m| *m),
    };
    if matches!(changed, Ok(Mode::Blackhole)) {
        // Silence: hold both ends, move nothing, until the mode changes again.
        let _ = rx.wait_for(|m| *m != Mode::Blackhole).await;
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
