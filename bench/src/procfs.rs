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

#[cfg(test)]
mod tests {
    #[test]
    fn samples_self() {
        let s = super::sample(std::process::id()).unwrap();
        assert!(s.rss_kb > 0 && s.hwm_kb >= s.rss_kb);
        assert!(super::sample(u32::MAX).is_none());
    }
}
