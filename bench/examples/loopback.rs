//! How long 10,480,000 bytes (a full List of 10,000 x 1 KB Pods) take to
//! cross a bare loopback TCP connection, by write and read size: the
//! transport under L1, with no HTTP and no server
//! (docs/BENCHMARKS.md#list-floor). `list` measures the same with 1 MiB in
//! its `loopback` row.
//!
//! ```sh
//! cargo run --release -p watchcache-bench --example loopback -- 65536 65536
//! cargo run --release -p watchcache-bench --example loopback -- 1048576 1048576
//! ```
//!
//! Arguments: the write size and the read size in bytes (default 1 MiB
//! each). 200 transfers, each from a one-byte request to the last byte;
//! prints the minimum, median and p90.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

use anyhow::{Context, Result, bail};

const BYTES: usize = 10_480_000;
const TRANSFERS: usize = 200;

fn size_arg(n: usize) -> Result<usize> {
    match std::env::args().nth(n) {
        None => Ok(1 << 20),
        Some(a) => match a.parse::<usize>() {
            Ok(v) if v > 0 => Ok(v),
            _ => bail!("argument {n}: a positive byte count, not {a:?}"),
        },
    }
}

fn main() -> Result<()> {
    let (chunk, read_size) = (size_arg(1)?, size_arg(2)?);
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let mut reader = TcpStream::connect(listener.local_addr()?).context("connect")?;
    let (mut writer, _) = listener.accept().context("accept")?;
    reader.set_nodelay(true)?;
    writer.set_nodelay(true)?;
    let sender = std::thread::spawn(move || -> Result<()> {
        let data = vec![7u8; BYTES];
        let mut req = [0u8; 1];
        while writer.read(&mut req)? == 1 {
            for c in data.chunks(chunk) {
                writer.write_all(c)?;
            }
        }
        Ok(())
    });
    let mut buf = vec![0u8; read_size];
    let mut ms = Vec::with_capacity(TRANSFERS);
    for _ in 0..TRANSFERS {
        let t = Instant::now();
        reader.write_all(&[1])?;
        let mut got = 0;
        while got < BYTES {
            match reader.read(&mut buf)? {
                0 => bail!("closed after {got} bytes"),
                n => got += n,
            }
        }
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    reader.shutdown(std::net::Shutdown::Both)?;
    sender
        .join()
        .map_err(|_| anyhow::anyhow!("the sender panicked"))??;
    ms.sort_by(f64::total_cmp);
    println!(
        "writes {chunk} B, reads {read_size} B: min {:.3} ms, p50 {:.3} ms, p90 {:.3} ms",
        ms[0],
        ms[TRANSFERS / 2],
        ms[TRANSFERS * 9 / 10]
    );
    Ok(())
}
