//! A real etcd cluster of three members for the tests that need one: free
//! loopback ports, own data dirs, and each member's peer URL behind a proxy
//! of the test's, so that one member can be cut off the others (a
//! partition) while the test and the daemon still reach its client port.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::eventually;

/// The member cut off the others: its index and its id as etcd writes it
/// in `X-Server-From` (hex).
type Isolated = Option<(usize, String)>;

/// Whether a peer connection to member `to`, opened by the member whose id
/// is `from` (when the request said), is cut while `isolated` is.
fn peer_cut(isolated: &Isolated, from: Option<&str>, to: usize) -> bool {
    isolated
        .as_ref()
        .is_some_and(|(i, id)| *i == to || from == Some(id.as_str()))
}

/// The `X-Server-From` header of an HTTP request head: the sending member's
/// id, on every raft stream, message and snapshot request etcd's peers
/// open (rafthttp). A stream carries the messages *to* the member that
/// opened it, so this is how a partition cuts both ways.
fn server_from(head: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(head).ok()?;
    text.split("\r\n").find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("x-server-from")
            .then(|| value.trim().to_string())
    })
}

/// One proxy per member's peer port; member `i`'s peers reach it at
/// `addrs[i]`.
struct PeerProxies {
    addrs: Vec<SocketAddr>,
    isolated: watch::Sender<Isolated>,
    tasks: Vec<JoinHandle<()>>,
}

impl PeerProxies {
    async fn start(targets: &[SocketAddr]) -> PeerProxies {
        let (isolated, _) = watch::channel::<Isolated>(None);
        let mut addrs = Vec::new();
        let mut tasks = Vec::new();
        for (to, &target) in targets.iter().enumerate() {
            let listener = TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind a peer proxy");
            addrs.push(listener.local_addr().expect("peer proxy addr"));
            let isolated = isolated.clone();
            tasks.push(tokio::spawn(async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    let rx = isolated.subscribe();
                    tokio::spawn(forward(inbound, target, to, rx));
                }
            }));
        }
        PeerProxies {
            addrs,
            isolated,
            tasks,
        }
    }
}

/// Passes one peer connection on to member `to`'s peer port until the
/// partition covers it.
async fn forward(
    mut inbound: TcpStream,
    target: SocketAddr,
    to: usize,
    mut rx: watch::Receiver<Isolated>,
) {
    // The request head first, to learn who opened the connection.
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        match inbound.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let from = server_from(&head);
    if peer_cut(&rx.borrow_and_update(), from.as_deref(), to) {
        return; // dropped: the member sees the connection close
    }
    let Ok(mut outbound) = TcpStream::connect(target).await else {
        return;
    };
    if outbound.write_all(&head).await.is_err() {
        return;
    }
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
        _ = rx.wait_for(|iso| peer_cut(iso, from.as_deref(), to)) => {}
    }
}

impl Drop for PeerProxies {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// A real etcd cluster of three members on free loopback ports (own data
/// dirs, peers through [`PeerProxies`]); members are SIGKILLed on drop (and
/// with the test thread: PDEATHSIG).
pub struct EtcdCluster {
    children: Vec<Option<std::process::Child>>,
    client_ports: Vec<u16>,
    /// Each member's id, hex, by index.
    ids: Vec<String>,
    peers: PeerProxies,
    _dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts three members and waits until each answers a linearizable read.
    pub async fn start() -> EtcdCluster {
        let bin = watchcache::etcd_server::find_etcd_binary().expect("etcd binary");
        let dir = tempfile::tempdir().expect("cluster dir");
        // All six ports held at once, so no two are the same.
        let held: Vec<std::net::TcpListener> = (0..6)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("free port"))
            .collect();
        let ports: Vec<u16> = held
            .iter()
            .map(|l| l.local_addr().expect("port").port())
            .collect();
        drop(held);
        let (client_ports, peer_ports) = ports.split_at(3);
        let peer_addrs: Vec<SocketAddr> = peer_ports
            .iter()
            .map(|p| SocketAddr::from(([127, 0, 0, 1], *p)))
            .collect();
        let peers = PeerProxies::start(&peer_addrs).await;
        let advertised: Vec<String> = peers.addrs.iter().map(|a| format!("http://{a}")).collect();
        let initial: Vec<String> = (0..3).map(|i| format!("m{i}={}", advertised[i])).collect();
        let mut children = Vec::new();
        for i in 0..3 {
            let client = format!("http://127.0.0.1:{}", client_ports[i]);
            let log = std::fs::File::create(dir.path().join(format!("m{i}.log"))).expect("log");
            let mut cmd = std::process::Command::new(&bin);
            cmd.arg(format!("--name=m{i}"))
                .arg(format!(
                    "--data-dir={}",
                    dir.path().join(format!("m{i}")).display()
                ))
                .arg(format!("--listen-client-urls={client}"))
                .arg(format!("--advertise-client-urls={client}"))
                .arg(format!("--listen-peer-urls=http://{}", peer_addrs[i]))
                .arg(format!("--initial-advertise-peer-urls={}", advertised[i]))
                .arg(format!("--initial-cluster={}", initial.join(",")))
                .arg("--log-level=warn")
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(log);
            watchcache::etcd_server::kill_with_parent(&mut cmd);
            children.push(Some(cmd.spawn().expect("spawn etcd member")));
        }
        let mut c = EtcdCluster {
            children,
            client_ports: client_ports.to_vec(),
            ids: Vec::new(),
            peers,
            _dir: dir,
        };
        for i in 0..3 {
            let ep = c.endpoint(i);
            let up = eventually(Duration::from_secs(60), || {
                let ep = ep.clone();
                async move {
                    match etcd_client::Client::connect([ep], None).await {
                        Ok(mut cl) => cl.get("/", None).await.is_ok(),
                        Err(_) => false,
                    }
                }
            })
            .await;
            assert!(up, "etcd member m{i} serves");
        }
        let mut client = etcd_client::Client::connect([c.endpoint(0)], None)
            .await
            .expect("client of m0");
        let members = client.member_list().await.expect("member list");
        c.ids = (0..3)
            .map(|i| {
                let m = members
                    .members()
                    .iter()
                    .find(|m| m.name() == format!("m{i}"))
                    .expect("every member listed");
                format!("{:x}", m.id())
            })
            .collect();
        c
    }

    /// Member `i`'s client URL.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.client_ports[i])
    }

    /// Member `i`'s client address.
    pub fn addr(&self, i: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.client_ports[i]))
    }

    /// The member that leads, as member 0's status says.
    pub async fn leader(&self) -> Option<usize> {
        let mut client = etcd_client::Client::connect([self.endpoint(0)], None)
            .await
            .ok()?;
        let leader = format!("{:x}", client.status().await.ok()?.leader());
        self.ids.iter().position(|id| *id == leader)
    }

    /// Cuts member `m` off the other two, both ways, and every peer
    /// connection it had (`None`: heals). Its client port stays open.
    pub fn isolate(&self, m: Option<usize>) {
        self.peers
            .isolated
            .send_replace(m.map(|i| (i, self.ids[i].clone())));
    }

    /// SIGKILLs member `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.children[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.children.len() {
            self.kill(i);
        }
    }
}
