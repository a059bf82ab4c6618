//! What the daemon's response compression (`api::compression`: flate2 on
//! zlib-rs, level 1, fed the List's 1 MiB frames) costs on a given body:
//! its ratio and its speed on one core (docs/BENCHMARKS.md#gzip).
//! The bench's own objects are padded with one repeated byte and compress
//! far better than real ones, so the body comes from a file, e.g. a PodList
//! shaped like a real cluster's from `docs/bench/gzip_pods.py`:
//!
//! ```sh
//! python3 docs/bench/gzip_pods.py 10000 --write /tmp/pods.json
//! cargo run --release -p watchcache-bench --example gzip -- /tmp/pods.json
//! ```
//!
//! Prints the sizes and the minimum and median of 9 compressions.

use std::io::Write;
use std::time::Instant;

use anyhow::{Context, Result};
use flate2::Compression;
use flate2::write::GzEncoder;

const RUNS: usize = 9;

fn main() -> Result<()> {
    let path = std::env::args()
        .nth(1)
        .context("usage: gzip <file> (a response body to compress)")?;
    let body = std::fs::read(&path).with_context(|| format!("reading {path}"))?;
    let mut packed = 0;
    let mut ms = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let t = Instant::now();
        let mut e = GzEncoder::new(Vec::with_capacity(body.len() / 4), Compression::new(1));
        for frame in body.chunks(1 << 20) {
            e.write_all(frame)?;
        }
        packed = e.finish()?.len();
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    ms.sort_by(f64::total_cmp);
    let median = ms[RUNS / 2];
    println!(
        "{} bytes -> {packed} bytes ({:.1}x); min {:.1} ms, median {median:.1} ms ({:.0} MB/s)",
        body.len(),
        body.len() as f64 / packed.max(1) as f64,
        ms[0],
        body.len() as f64 / median / 1000.0,
    );
    Ok(())
}
