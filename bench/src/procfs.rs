//! CPU time and memory of a process, read from `/proc/PID/stat` and
//! `/proc/PID/status`, plus a few facts about the machine.

use serde::Serialize;

/// One reading of a process.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ProcSample {
    /// User + system CPU seconds since the process started.
    pub cpu_s: f64,
    /// Resident set size now (VmRSS), KiB.
    pub rss_kb: u64,
    /// Peak resident set size (VmHWM), KiB.
    pub hwm_kb: u64,
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// Reads `/proc/PID/stat` and `/proc/PID/status`; `None` if the process is gone.
pub fn sample(pid: u32) -> Option<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime is field 14, stime field 15.
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = |key: &str| -> u64 {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Some(ProcSample {
        cpu_s: (utime + stime) / clock_ticks(),
        rss_kb: kb("VmRSS:"),
        hwm_kb: kb("VmHWM:"),
    })
}

/// Resets the peak RSS (VmHWM) of a process to its current RSS (Linux >= 4.0).
pub fn reset_peak(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// This process's pid.
pub fn self_pid() -> u32 {
    std::process::id()
}

/// Raises RLIMIT_NOFILE to the hard limit; returns the new soft limit.
pub fn raise_nofile_limit() -> u64 {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
            return 0;
        }
        if rl.rlim_cur < rl.rlim_max {
            let want = libc::rlimit {
                rlim_cur: rl.rlim_max,
                rlim_max: rl.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                return want.rlim_cur;
            }
        }
    }
    rl.rlim_cur
}

/// The machine the figures were taken on.
#[derive(Debug, Clone, Serialize)]
pub struct MachineInfo {
    pub nproc: usize,
    pub cpu_model: String,
    pub mem_total_kb: u64,
    pub kernel: String,
    pub nofile_limit: u64,
}

pub fn machine_info(nofile_limit: u64) -> MachineInfo {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_total_kb = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    MachineInfo {
        nproc: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        cpu_model,
        mem_total_kb,
        kernel,
        nofile_limit,
    }
}

/// Which of `pids` holds the TCP socket whose local end is `local` and
/// whose remote end is `remote` (IPv4), from `/proc/net/tcp` and each
/// process's `/proc/PID/fd`: the index into `pids`, `None` if none does.
/// The chaos run's peer proxies learn so which etcd member opened a
/// connection to them.
pub fn tcp_socket_owner(
    local: std::net::SocketAddr,
    remote: std::net::SocketAddr,
    pids: &[u32],
) -> Option<usize> {
    let inode = tcp_inode(
        &std::fs::read_to_string("/proc/net/tcp").ok()?,
        local,
        remote,
    )?;
    let target = format!("socket:[{inode}]");
    pids.iter().position(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == target.as_str()))
    })
}

/// `/proc/net/tcp`'s form of an IPv4 address: the address as a little-endian
/// u32 in hex, a colon, the port in hex (`0100007F:1F90` is 127.0.0.1:8080).
fn proc_net_addr(a: std::net::SocketAddr) -> Option<String> {
    match a {
        std::net::SocketAddr::V4(v4) => Some(format!(
            "{:08X}:{:04X}",
            u32::from_le_bytes(v4.ip().octets()),
            v4.port()
        )),
        std::net::SocketAddr::V6(_) => None,
    }
}

/// The inode of the socket `local` -> `remote` in a `/proc/net/tcp` table.
fn tcp_inode(
    table: &str,
    local: std::net::SocketAddr,
    remote: std::net::SocketAddr,
) -> Option<u64> {
    let (l, r) = (proc_net_addr(local)?, proc_net_addr(remote)?);
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.get(1) == Some(&l.as_str()) && f.get(2) == Some(&r.as_str()))
            .then(|| f.get(9)?.parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_self() {
        let s = sample(std::process::id()).unwrap();
        assert!(s.rss_kb > 0 && s.hwm_kb >= s.rss_kb);
        assert!(sample(u32::MAX).is_none());
    }

    #[test]
    fn a_connection_is_traced_to_the_process_that_opened_it() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(server).unwrap();
        let (_accepted, from) = listener.accept().unwrap();
        assert_eq!(from, client.local_addr().unwrap());
        let me = std::process::id();
        assert_eq!(tcp_socket_owner(from, server, &[1, me]), Some(1));
        // Not a process on the list; not a socket that exists.
        assert_eq!(tcp_socket_owner(from, server, &[1]), None);
        assert_eq!(tcp_socket_owner(server, server, &[me]), None);
    }

    #[test]
    fn proc_net_tcp_rows_are_matched_by_both_ends() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 4242 1 0 20 4 30 10 -1\n   1: 0100007F:D431 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0 20 4 30 10 -1\n";
        let a = "127.0.0.1:8080".parse().unwrap();
        let b = "127.0.0.1:54321".parse().unwrap();
        assert_eq!(tcp_inode(table, a, b), Some(4242));
        assert_eq!(tcp_inode(table, b, a), Some(4343));
        assert_eq!(tcp_inode(table, a, a), None);
    }
}
