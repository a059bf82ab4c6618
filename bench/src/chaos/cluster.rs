//! `chaos --etcd-members N`: a cluster of N etcd members on loopback, each
//! with its own data dir and client and peer ports. The members advertise the
//! bench's [`PeerMesh`] proxies as their peer URLs, so the bench can cut one
//! member off the others. A member is killed, stopped, restarted or upgraded
//! (another binary on the same data dir) by the bench.
//!
//! Members are spawned from the thread that runs the chaos run (PDEATHSIG:
//! they die with it).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::proxy::PeerMesh;
use crate::env::etcd_connect;
use watchcache::etcd_server::kill_with_parent;

/// Every member saves a raft snapshot (and replays its log from there on
/// a restart) after this many applied entries (etcd 3.6's default is
/// 10,000).
pub const SNAPSHOT_COUNT: usize = 1000;

struct Member {
    name: String,
    client_port: u16,
    binary: PathBuf,
    child: Option<Child>,
}

/// The cluster.
pub struct Cluster {
    dir: tempfile::TempDir,
    members: Vec<Member>,
    peer_ports: Vec<u16>,
    pub mesh: PeerMesh,
    initial_cluster: String,
}

/// One member's view of the cluster (etcd's maintenance Status).
#[derive(Debug, Clone)]
pub struct MemberStatus {
    pub member_id: u64,
    pub leader: u64,
    pub raft_index: u64,
    pub version: String,
}

impl Cluster {
    /// Starts `n` members of `binary` and waits until each is healthy.
    /// Ports are picked free and released before etcd binds them, so another
    /// process can take one in between: then it tries again with new ones.
    pub async fn start(n: usize, binary: &Path) -> Result<Cluster> {
        let mut last = None;
        for _ in 0..3 {
            match Cluster::start_once(n, binary).await {
                Ok(c) => return Ok(c),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow!("no cluster")))
    }

    async fn start_once(n: usize, binary: &Path) -> Result<Cluster> {
        let dir = tempfile::Builder::new()
            .prefix("watchcache-bench-cluster-")
            .tempdir()?;
        // Every port held until the proxies have theirs (no two the same).
        let mut held = Vec::new();
        let mut port = || -> Result<u16> {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            let p = l.local_addr()?.port();
            held.push(l);
            Ok(p)
        };
        let mut peer_ports = Vec::new();
        let mut members = Vec::new();
        for i in 0..n {
            peer_ports.push(port()?);
            members.push(Member {
                name: format!("m{i}"),
                client_port: port()?,
                binary: binary.to_path_buf(),
                child: None,
            });
        }
        let targets: Vec<std::net::SocketAddr> = peer_ports
            .iter()
            .map(|p| std::net::SocketAddr::from(([127, 0, 0, 1], *p)))
            .collect();
        let mesh = PeerMesh::start(&targets).await?;
        drop(held);
        let initial_cluster = members
            .iter()
            .zip(&mesh.addrs)
            .map(|(m, a)| format!("{}=http://{a}", m.name))
            .collect::<Vec<_>>()
            .join(",");
        let mut c = Cluster {
            dir,
            members,
            peer_ports,
            mesh,
            initial_cluster,
        };
        for i in 0..n {
            c.spawn(i)?;
        }
        for i in 0..n {
            c.wait_healthy(i, Duration::from_secs(60)).await?;
        }
        Ok(c)
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn name(&self, i: usize) -> &str {
        &self.members[i].name
    }

    /// Member `i`'s client URL.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].client_port)
    }

    pub fn endpoints(&self) -> Vec<String> {
        (0..self.len()).map(|i| self.endpoint(i)).collect()
    }

    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(|c| c.id())
    }

    pub fn set_binary(&mut self, i: usize, binary: &Path) {
        self.members[i].binary = binary.to_path_buf();
    }

    fn log_path(&self, i: usize) -> PathBuf {
        self.dir
            .path()
            .join(format!("{}.log", self.members[i].name))
    }

    /// Starts member `i`'s process on its data dir (new or kept).
    pub fn spawn(&mut self, i: usize) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(i))?;
        let data = self.dir.path().join(&self.members[i].name);
        let client = self.endpoint(i);
        let m = &self.members[i];
        let mut cmd = Command::new(&m.binary);
        cmd.arg(format!("--name={}", m.name))
            .arg(format!("--data-dir={}", data.display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!(
                "--listen-peer-urls=http://127.0.0.1:{}",
                self.peer_ports[i]
            ))
            .arg(format!(
                "--initial-advertise-peer-urls=http://{}",
                self.mesh.addrs[i]
            ))
            .arg(format!("--initial-cluster={}", self.initial_cluster))
            .arg("--initial-cluster-state=new")
            .arg("--initial-cluster-token=watchcache-bench-chaos")
            .arg(format!("--snapshot-count={SNAPSHOT_COUNT}"))
            .arg("--log-level=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log));
        kill_with_parent(&mut cmd);
        let child = cmd
            .spawn()
            .with_context(|| format!("spawning {}", m.binary.display()))?;
        self.mesh.set_pid(i, child.id());
        self.members[i].child = Some(child);
        Ok(())
    }

    /// SIGKILLs every member, starts them all again and waits until each is
    /// healthy; returns the time from the restart to the last one healthy.
    pub async fn kill_and_restart_all(&mut self) -> Result<Duration> {
        for i in 0..self.len() {
            self.kill(i);
        }
        let t = Instant::now();
        for i in 0..self.len() {
            self.spawn(i)?;
        }
        for i in 0..self.len() {
            self.wait_healthy(i, Duration::from_secs(60)).await?;
        }
        Ok(t.elapsed())
    }

    /// SIGKILLs member `i` (its data dir stays) and reaps it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.mesh.set_pid(i, 0);
    }

    /// SIGTERMs member `i` (a leader hands its leadership over first) and
    /// waits up to 20 s for it to exit, then SIGKILLs it.
    pub async fn terminate(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe {
                libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                if Instant::now() >= deadline {
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        self.mesh.set_pid(i, 0);
    }

    /// Polls member `i`'s `/health` until it answers `"health":"true"`;
    /// returns the time it took.
    pub async fn wait_healthy(&mut self, i: usize, timeout: Duration) -> Result<Duration> {
        let t0 = Instant::now();
        loop {
            if self.healthy(i).await {
                return Ok(t0.elapsed());
            }
            if let Some(c) = self.members[i].child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                bail!(
                    "etcd member {} exited with {status}; log:\n{}",
                    self.members[i].name,
                    self.log_tail(i)
                );
            }
            if t0.elapsed() >= timeout {
                bail!(
                    "etcd member {} not healthy after {timeout:?}; log:\n{}",
                    self.members[i].name,
                    self.log_tail(i)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn healthy(&self, i: usize) -> bool {
        let port = self.members[i].client_port;
        let fut = async {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
            s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                .await?;
            let mut buf = Vec::new();
            s.read_to_end(&mut buf).await?;
            Ok::<_, std::io::Error>(String::from_utf8_lossy(&buf).contains("\"health\":\"true\""))
        };
        matches!(
            tokio::time::timeout(Duration::from_secs(2), fut).await,
            Ok(Ok(true))
        )
    }

    /// The end of member `i`'s log, from its last panic if it has one.
    fn log_tail(&self, i: usize) -> String {
        let text = std::fs::read_to_string(self.log_path(i)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines
            .iter()
            .rposition(|l| l.starts_with("panic:") || l.contains("\"level\":\"panic\""))
            .unwrap_or(lines.len().saturating_sub(10));
        lines[from..lines.len().min(from + 12)].join("\n")
    }

    /// Kills (if running) and starts member `i` again on its data dir;
    /// returns the time from spawn to healthy.
    pub async fn restart(&mut self, i: usize) -> Result<Duration> {
        self.kill(i);
        self.spawn(i)?;
        self.wait_healthy(i, Duration::from_secs(60)).await
    }

    /// Member `i`'s Status (None if it does not answer within 2 s).
    pub async fn status(&self, i: usize) -> Option<MemberStatus> {
        let ep = self.endpoint(i);
        tokio::time::timeout(Duration::from_secs(2), async move {
            let c = etcd_connect(&ep).await.ok()?;
            let s = c.maintenance_client().status().await.ok()?;
            Some(MemberStatus {
                member_id: s.header()?.member_id(),
                leader: s.leader(),
                raft_index: s.raft_index(),
                version: s.version().to_string(),
            })
        })
        .await
        .ok()
        .flatten()
    }

    /// The member that is the leader, as the running members report it
    /// (`etcdctl endpoint status`: the member whose id is its leader).
    pub async fn leader(&self) -> Option<usize> {
        for i in 0..self.len() {
            if self.pid(i).is_none() {
                continue;
            }
            if let Some(s) = self.status(i).await
                && s.leader != 0
                && s.leader == s.member_id
            {
                return Some(i);
            }
        }
        None
    }

    /// Waits until some member is the leader.
    pub async fn wait_leader(&self, timeout: Duration) -> Result<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.leader().await {
                return Ok(l);
            }
            if Instant::now() >= deadline {
                bail!("no etcd leader after {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until member `i` has applied as far as the leader had when
    /// asked: it has caught up after a partition or a restart.
    pub async fn wait_caught_up(&self, i: usize, timeout: Duration) -> Result<Duration> {
        let t0 = Instant::now();
        let l = self.wait_leader(timeout).await?;
        let target = self
            .status(l)
            .await
            .ok_or_else(|| anyhow!("the leader does not answer Status"))?
            .raft_index;
        loop {
            if self.status(i).await.is_some_and(|s| s.raft_index >= target) {
                return Ok(t0.elapsed());
            }
            if t0.elapsed() >= timeout {
                bail!(
                    "member {} did not catch up with raft index {target} in {timeout:?}",
                    self.members[i].name
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The cluster version (`etcdcluster` of `/version`) member `i` reports.
    pub async fn cluster_version(&self, i: usize) -> Option<String> {
        let authority = format!("127.0.0.1:{}", self.members[i].client_port);
        let (_, body) = tokio::time::timeout(
            Duration::from_secs(2),
            crate::http::get_once(&authority, "/version"),
        )
        .await
        .ok()?
        .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&body).ok()?;
        v["etcdcluster"].as_str().map(str::to_string)
    }

    /// Waits until every member runs the same minor version and the
    /// cluster version has followed it (after a rolling upgrade: etcd moves
    /// the cluster version up once every member runs the newer one).
    /// Returns the cluster version.
    pub async fn wait_cluster_version(&self, timeout: Duration) -> Result<String> {
        let minor = |v: &str| v.split('.').take(2).collect::<Vec<_>>().join(".");
        let deadline = Instant::now() + timeout;
        loop {
            let mut servers = Vec::new();
            for i in 0..self.len() {
                servers.push(self.status(i).await.map(|s| minor(&s.version)));
            }
            let cluster = self.cluster_version(0).await;
            if let (Some(Some(v)), Some(cv)) = (servers.first(), &cluster)
                && servers.iter().all(|s| s.as_ref() == Some(v))
                && minor(cv) == *v
            {
                return Ok(cv.clone());
            }
            if Instant::now() >= deadline {
                bail!("members at {servers:?}, cluster version {cluster:?} after {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The number of gRPC watch streams open on member `i`
    /// (`etcd_debugging_mvcc_watch_stream_total`).
    pub async fn watch_streams(&self, i: usize) -> Option<f64> {
        crate::env::etcd_metric(&self.endpoint(i), "etcd_debugging_mvcc_watch_stream_total").await
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
