//! The daemon's resident memory through a chaos run, sampled every
//! [`EVERY`] from `/proc` (a soak's "memory flat", docs/RELIABILITY.md).
//! The daemon's pid changes when the run kills and restarts it; each
//! sample says which process it read, so a report shows every lifetime.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::procfs;

/// How often the sampler reads the daemon's RSS.
pub const EVERY: Duration = Duration::from_secs(10);

/// One reading: seconds into the run, the daemon's pid, its RSS in KiB.
type Sample = (f64, u32, u64);

/// Samples the daemon's RSS until dropped.
pub struct RssSampler {
    pid: Arc<AtomicU32>,
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: CancellationToken,
}

impl RssSampler {
    /// Starts sampling `pid` (0: none yet); times are from `t0`.
    pub fn start(pid: u32, t0: Instant) -> RssSampler {
        let s = RssSampler {
            pid: Arc::new(AtomicU32::new(pid)),
            samples: Arc::new(Mutex::new(Vec::new())),
            stop: CancellationToken::new(),
        };
        let (pid, samples, stop) = (s.pid.clone(), s.samples.clone(), s.stop.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(EVERY);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tick.tick() => {}
                }
                let p = pid.load(Ordering::Relaxed);
                if let Some(ps) = (p != 0).then(|| procfs::sample(p)).flatten() {
                    samples
                        .lock()
                        .push((t0.elapsed().as_secs_f64(), p, ps.rss_kb));
                }
            }
        });
        s
    }

    /// The daemon was restarted as `pid`.
    pub fn set_pid(&self, pid: u32) {
        self.pid.store(pid, Ordering::Relaxed);
    }

    /// The report: every sample, and per daemon process its first and last
    /// RSS and its peak; the peak of the run's first and last quarter.
    pub fn report(&self) -> Value {
        summarize(&self.samples.lock())
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn summarize(samples: &[Sample]) -> Value {
    let mut lifetimes: Vec<Value> = Vec::new();
    let mut i = 0;
    while i < samples.len() {
        let pid = samples[i].1;
        let run: Vec<&Sample> = samples[i..].iter().take_while(|s| s.1 == pid).collect();
        i += run.len();
        if let (Some(first), Some(last)) = (run.first(), run.last()) {
            lifetimes.push(json!({
                "pid": pid,
                "from_s": first.0.round(),
                "to_s": last.0.round(),
                "first_rss_kb": first.2,
                "last_rss_kb": last.2,
                "peak_rss_kb": run.iter().map(|s| s.2).max(),
            }));
        }
    }
    let end = samples.last().map_or(0.0, |s| s.0);
    let peak_in = |lo: f64, hi: f64| {
        samples
            .iter()
            .filter(|s| s.0 >= lo && s.0 <= hi)
            .map(|s| s.2)
            .max()
    };
    json!({
        "every_s": EVERY.as_secs(),
        "peak_rss_kb": samples.iter().map(|s| s.2).max(),
        "first_quarter_peak_rss_kb": peak_in(0.0, end / 4.0),
        "last_quarter_peak_rss_kb": peak_in(end * 3.0 / 4.0, end),
        "daemon_lifetimes": lifetimes,
        "samples": samples.iter().map(|s| json!([s.0.round(), s.1, s.2])).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetimes_split_on_a_new_pid() {
        let s = [(10.0, 7, 100), (20.0, 7, 140), (30.0, 9, 90), (40.0, 9, 95)];
        let v = summarize(&s);
        let l = v["daemon_lifetimes"].as_array().map(Vec::len);
        assert_eq!(l, Some(2));
        assert_eq!(v["daemon_lifetimes"][0]["peak_rss_kb"], 140);
        assert_eq!(v["daemon_lifetimes"][1]["first_rss_kb"], 90);
        assert_eq!(v["peak_rss_kb"], 140);
        assert_eq!(v["first_quarter_peak_rss_kb"], 100);
        assert_eq!(v["last_quarter_peak_rss_kb"], 95);
    }
}
