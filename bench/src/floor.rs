//! The loopback floor of a List: the same bytes moved over a bare loopback
//! TCP connection, with no HTTP and no server, in the same run as the Lists.
//!
//! A full List from the cache is bytes already serialized in memory, so what
//! is left of its time is the transport (docs/BENCHMARKS.md#list-floor). This
//! measures that transport alone, so a run shows how far a List is from it
//! and about the most a server could reach against etcd's List in that
//! minute (the bare transfer has a slow mode of its own: a reference, not a
//! bound no List can beat).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::thread;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use hdrhistogram::Histogram;

/// Size of each write and read: 1 MiB, the size of the daemon's kept List
/// frames and of the bench client's HTTP/2 frames. 64 KiB writes were
/// slower than the daemon's own List on the benchmark machine, so no floor
/// (docs/BENCHMARKS.md#what-did-not-work).
const IO_CHUNK: usize = 1024 * 1024;

/// Moves `body` from one thread to another over a fresh loopback TCP
/// connection `iterations` times, each timed as a List is: from a one-byte
/// request to the body's last byte, after one untimed transfer checked byte
/// for byte. Blocking: run it off the async runtime.
pub fn loopback_floor(body: &[u8], iterations: usize) -> Result<Histogram<u64>> {
    if body.is_empty() {
        bail!("loopback floor: nothing to send");
    }
    let listener = TcpListener::bind("127.0.0.1:0").context("loopback floor: bind")?;
    // Connected and accepted here, before the sender starts: a failure
    // leaves no thread waiting.
    let mut reader =
        TcpStream::connect(listener.local_addr()?).context("loopback floor: connect")?;
    let (mut writer, _) = listener.accept().context("loopback floor: accept")?;
    reader.set_nodelay(true)?;
    writer.set_nodelay(true)?;
    let mut hist = crate::report::new_histogram();
    thread::scope(|s| -> Result<()> {
        let sender = s.spawn(move || -> Result<()> {
            let mut req = [0u8; 1];
            // One body per request byte, until the reader closes.
            while writer.read(&mut req)? == 1 {
                for c in body.chunks(IO_CHUNK) {
                    writer.write_all(c)?;
                }
            }
            Ok(())
        });
        let received = receive(&mut reader, body, iterations, &mut hist);
        // Closing ends the sender, whatever the reader's result.
        let _ = reader.shutdown(Shutdown::Both);
        let sent = sender
            .join()
            .map_err(|_| anyhow::anyhow!("loopback floor: the sender panicked"))?;
        received.and(sent)
    })?;
    Ok(hist)
}

/// The reading side of [`loopback_floor`]: one untimed transfer checked
/// byte for byte (also the warm-up, as the Lists have theirs), then
/// `iterations` timed ones.
fn receive(
    conn: &mut TcpStream,
    body: &[u8],
    iterations: usize,
    hist: &mut Histogram<u64>,
) -> Result<()> {
    let mut buf = vec![0u8; IO_CHUNK];
    for i in 0..=iterations {
        let t = Instant::now();
        conn.write_all(&[1])?;
        let mut got = 0usize;
        while got < body.len() {
            let n = conn.read(&mut buf)?;
            if n == 0 {
                bail!("loopback floor: closed after {got} of {} bytes", body.len());
            }
            if i == 0 && body.get(got..got + n) != Some(&buf[..n]) {
                bail!(
                    "loopback floor: bytes {got}..{} differ from the body",
                    got + n
                );
            }
            got += n;
        }
        if i > 0 {
            hist.record(t.elapsed().as_micros() as u64)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_transfer_is_timed_and_the_bytes_arrive_intact() {
        // 32 MiB: each transfer takes milliseconds, so its time is a value a
        // histogram sized for microseconds would clamp.
        let body: Vec<u8> = (0..32 * IO_CHUNK + 17).map(|i| (i % 251) as u8).collect();
        let t = Instant::now();
        let h = loopback_floor(&body, 4).unwrap();
        let wall_us = t.elapsed().as_micros() as f64;
        assert_eq!(h.len(), 4);
        // Every transfer is recorded, within the call's time, and none is
        // clamped at the histogram's ceiling (a busy machine may stretch
        // the call around them, so no lower bound against the wall time).
        let recorded_us = h.mean() * h.len() as f64;
        assert!(
            recorded_us <= wall_us,
            "recorded {recorded_us} us of {wall_us} us"
        );
        assert!(h.min() > 0, "a transfer took no time: {}", h.min());
        assert!(h.max() < h.high(), "clamped at {}", h.high());
    }

    #[test]
    fn an_empty_body_is_refused() {
        assert!(loopback_floor(&[], 3).is_err());
    }
}
