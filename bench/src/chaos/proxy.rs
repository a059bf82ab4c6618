//! The TCP proxy between the daemon and etcd, so the bench can take etcd
//! away from the daemon alone: `cut` resets every connection and refuses new
//! ones (etcd is down for the daemon); `blackhole` keeps connections open but
//! moves no bytes (a partition: the daemon hears nothing until its own
//! timeouts fire); `forward` restores the path (blackholed connections are
//! then reset, as after a real partition their streams are stale).
//!
//! [`PeerMesh`]: one proxy in front of each etcd member's peer port (the
//! members advertise the proxies as their peer URLs), so the bench can cut
//! one member off the others: every connection to it, and every connection
//! it opened to another member (found by the process that owns the
//! connecting socket), is reset and refused until the partition heals.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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
    /// Bytes forwarded from the target to the clients so far.
    to_clients: Arc<AtomicU64>,
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
        let to_clients = Arc::new(AtomicU64::new(0));
        let counter = to_clients.clone();
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let mut rx = modes.subscribe();
                let m = *rx.borrow_and_update();
                let counter = counter.clone();
                tokio::spawn(async move {
                    match m {
                        Mode::Cut => {} // dropped: the client sees a reset
                        Mode::Blackhole => {
                            // Hold the connection silently until the mode changes.
                            let _held = inbound;
                            let _ = rx.changed().await;
                        }
                        Mode::Forward => forward(inbound, target, rx, &counter).await,
                    }
                });
            }
        });
        Ok(TcpProxy {
            addr,
            mode,
            task,
            to_clients,
        })
    }

    /// Bytes forwarded from the target to the clients so far (an etcd
    /// watch's events dominate them).
    pub fn bytes_to_clients(&self) -> u64 {
        self.to_clients.load(Ordering::Relaxed)
    }

    /// The URL to give the daemon as its etcd endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set(&self, m: Mode) {
        self.mode.send_replace(m);
    }
}

async fn forward(
    mut inbound: TcpStream,
    target: SocketAddr,
    mut rx: watch::Receiver<Mode>,
    to_client: &AtomicU64,
) {
    let Ok(mut outbound) = TcpStream::connect(target).await else {
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (mut client_r, mut client_w) = inbound.split();
    let (mut target_r, mut target_w) = outbound.split();
    let down = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match target_r.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if client_w.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                    to_client.fetch_add(n as u64, Ordering::Relaxed);
                }
            }
        }
    };
    let changed = tokio::select! {
        _ = tokio::io::copy(&mut client_r, &mut target_w) => return,
        _ = down => return,
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

/// Proxies in front of the peer ports of a cluster's members.
pub struct PeerMesh {
    /// Where member `i`'s peers reach it (its advertised peer URL).
    pub addrs: Vec<SocketAddr>,
    /// The pid of each member's process (0: not running).
    pids: Arc<Mutex<Vec<u32>>>,
    isolated: watch::Sender<Option<usize>>,
    tasks: Vec<JoinHandle<()>>,
}

/// Whether a connection from member `from` to member `to` is cut while
/// `isolated` is cut off the others.
fn peer_cut(isolated: Option<usize>, from: Option<usize>, to: usize) -> bool {
    isolated.is_some_and(|m| m == to || Some(m) == from)
}

impl PeerMesh {
    /// One proxy on a free loopback port per peer port in `targets`.
    pub async fn start(targets: &[SocketAddr]) -> Result<PeerMesh> {
        let pids = Arc::new(Mutex::new(vec![0; targets.len()]));
        let (isolated, _) = watch::channel(None);
        let mut addrs = Vec::new();
        let mut tasks = Vec::new();
        for (to, &target) in targets.iter().enumerate() {
            let listener = TcpListener::bind("127.0.0.1:0")
                .await
                .context("binding a peer proxy")?;
            let addr = listener.local_addr()?;
            addrs.push(addr);
            let (pids, isolated) = (pids.clone(), isolated.clone());
            tasks.push(tokio::spawn(async move {
                while let Ok((inbound, from_addr)) = listener.accept().await {
                    let (pids, mut rx) = (pids.clone(), isolated.subscribe());
                    tokio::spawn(async move {
                        let known = pids.lock().clone();
                        let from = tokio::task::spawn_blocking(move || {
                            crate::procfs::tcp_socket_owner(from_addr, addr, &known)
                        })
                        .await
                        .ok()
                        .flatten();
                        if peer_cut(*rx.borrow_and_update(), from, to) {
                            return; // dropped: the member sees a reset
                        }
                        let Ok(mut outbound) = TcpStream::connect(target).await else {
                            return;
                        };
                        let mut inbound = inbound;
                        let _ = inbound.set_nodelay(true);
                        let _ = outbound.set_nodelay(true);
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                            _ = rx.wait_for(|iso| peer_cut(*iso, from, to)) => {}
                        }
                    });
                }
            }));
        }
        Ok(PeerMesh {
            addrs,
            pids,
            isolated,
            tasks,
        })
    }

    /// Records the pid of member `i`'s (new) process.
    pub fn set_pid(&self, i: usize, pid: u32) {
        if let Some(p) = self.pids.lock().get_mut(i) {
            *p = pid;
        }
    }

    /// Cuts member `m` off the others (`None`: heals the partition).
    pub fn isolate(&self, m: Option<usize>) {
        self.isolated.send_replace(m);
    }
}

impl Drop for PeerMesh {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn a_partition_cuts_the_isolated_member_both_ways_only() {
        assert!(peer_cut(Some(1), Some(0), 1)); // to it
        assert!(peer_cut(Some(1), Some(1), 2)); // from it
        assert!(!peer_cut(Some(1), Some(0), 2)); // between the others
        assert!(!peer_cut(Some(1), None, 2)); // an unknown process, to another
        assert!(peer_cut(Some(1), None, 1));
        assert!(!peer_cut(None, Some(1), 0));
    }

    /// An echo server; returns its address.
    async fn echo() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        a
    }

    async fn round_trip(addr: SocketAddr) -> bool {
        let Ok(mut s) = TcpStream::connect(addr).await else {
            return false;
        };
        if s.write_all(b"ping").await.is_err() {
            return false;
        }
        let mut buf = [0u8; 4];
        matches!(
            tokio::time::timeout(std::time::Duration::from_secs(5), s.read_exact(&mut buf)).await,
            Ok(Ok(_))
        ) && &buf == b"ping"
    }

    #[tokio::test]
    async fn the_mesh_cuts_connections_of_the_isolated_member() {
        let targets = [echo().await, echo().await];
        let mesh = PeerMesh::start(&targets).await.unwrap();
        // This process plays member 0.
        mesh.set_pid(0, std::process::id());
        assert!(round_trip(mesh.addrs[1]).await);
        let mut held = TcpStream::connect(mesh.addrs[1]).await.unwrap();
        held.write_all(b"x").await.unwrap();
        let mut one = [0u8; 1];
        held.read_exact(&mut one).await.unwrap();
        mesh.isolate(Some(1));
        // Connections to the isolated member are cut, held ones too.
        assert!(!round_trip(mesh.addrs[1]).await);
        let mut rest = Vec::new();
        let r = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            held.read_to_end(&mut rest),
        )
        .await;
        assert!(matches!(r, Ok(Ok(0)) | Ok(Err(_))), "{r:?}");
        // Member 0 still reaches itself (no other member is cut).
        assert!(round_trip(mesh.addrs[0]).await);
        mesh.isolate(Some(0));
        // Now every connection member 0 opens is cut, whoever it goes to.
        assert!(!round_trip(mesh.addrs[1]).await);
        assert!(!round_trip(mesh.addrs[0]).await);
        mesh.isolate(None);
        assert!(round_trip(mesh.addrs[1]).await);
    }
}
