//! Deflate work shared by every gzip response: the compression slots (one
//! per core, on tokio's blocking pool), and kept List frames compressed
//! once as raw deflate blocks ([`GzipItems`]) for every List of the same
//! objects.

use std::io::{self, Write};
use std::sync::Arc;

use bytes::Bytes;
use flate2::write::DeflateEncoder;
use flate2::{Compression, Crc};
use tracing::warn;

use super::budget::{ListBodyBudget, Reservation};

/// kube-apiserver's `defaultGzipContentEncodingLevel`: the least CPU, and a
/// ratio within 1.1-1.3x of the higher levels (kubernetes#112296).
pub(super) const LEVEL: u32 = 1;

/// Compressions running at once, in all responses: one per core.
static SLOTS: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();

fn slots() -> &'static tokio::sync::Semaphore {
    SLOTS.get_or_init(|| {
        tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(2, |n| n.get()))
    })
}

/// `work` on tokio's blocking pool, in one of the [`SLOTS`]. The permit
/// goes with the work: held until it ends, even if the caller is dropped
/// meanwhile, so no more than [`SLOTS`] compressions ever run at once.
pub(super) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    in_slot(slot().await, work).await
}

/// A place in the [`SLOTS`], waited for.
pub(super) async fn slot() -> Option<tokio::sync::SemaphorePermit<'static>> {
    // Never closed: `None` cannot happen, and would only mean no bound.
    slots().acquire().await.ok()
}

/// `work` on tokio's blocking pool, holding `slot` until it ends.
pub(super) async fn in_slot<T: Send + 'static>(
    slot: Option<tokio::sync::SemaphorePermit<'static>>,
    work: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        work()
    })
    .await
    .map_err(io::Error::other)?
}

/// Kept frames as raw deflate blocks ending on a byte boundary (a sync
/// flush, not the last block), with their CRC-32 and length: any List's
/// own head can be put before them and the end of the stream after
/// ([`spliced`]), so they are compressed once for every List of the same
/// objects (what `pigz` does to compress in parallel; RFC 1951 allows a
/// stream of blocks from separate compressors when none refers back
/// across the join, which a compressor that starts fresh never does).
pub struct GzipItems {
    pub(super) frames: Box<[Bytes]>,
    pub(super) crc: Crc,
    /// Their bytes in the budget, until the last holder (the kept frames,
    /// or a response still being written from them) drops them.
    held: Reservation,
}

impl GzipItems {
    /// Memory held.
    pub fn bytes(&self) -> usize {
        self.held.bytes()
    }
}

/// Room taken from the budget before compressing, as a share of the
/// input: JSON Lists shrink 6-8x at level 1 (docs/bench/gzip_pods.py), so
/// a body that will not fit is found out before the work, not after.
pub(super) const RESERVE_DIVISOR: usize = 3;

/// No room in the budget now (others hold it: recordings, other kept
/// bodies): a later List tries again.
#[derive(Debug)]
pub struct NoRoomNow;

/// [`GzipItems`] of `frames`, made on the blocking pool and held in
/// `budget`; `None` if they will never fit or cannot be made (logged), so
/// they are not tried again. The reserve is taken once a slot is free, so
/// a List only waiting to compress holds no budget; when even the reserve
/// does not fit, nothing is compressed; and the output's buffer grows only
/// as the budget allows ([`CountedVec`]), so a body that compresses badly
/// is given up as soon as it would not fit.
pub async fn deflate_items(
    frames: Arc<[Bytes]>,
    budget: &Arc<ListBodyBudget>,
) -> Result<Option<GzipItems>, NoRoomNow> {
    let total: usize = frames.iter().map(Bytes::len).sum();
    let reserve = total / RESERVE_DIVISOR;
    let limit = budget.limit();
    if reserve > limit {
        return Ok(None);
    }
    let slot = slot().await;
    // Moved into the work, which gives it back however it ends (it runs on
    // when this future is dropped, and its buffer with it).
    let held = budget.reserve(reserve).ok_or(NoRoomNow)?;
    let budget = Arc::clone(budget);
    let made = in_slot(slot, move || {
        let mut enc = DeflateEncoder::new(CountedVec::new(held), Compression::new(LEVEL));
        let mut crc = Crc::new();
        for f in frames.iter() {
            enc.write_all(f)?;
            crc.update(f);
        }
        // A sync flush: everything out, ending on a byte boundary, the
        // stream left open.
        enc.flush()?;
        let counted = enc.get_mut();
        let mut out = std::mem::take(&mut counted.out);
        let mut held = std::mem::replace(&mut counted.held, budget.empty());
        out.shrink_to_fit();
        // Shrinking always succeeds.
        held.resize(out.len());
        Ok(((out, held), crc))
    })
    .await;
    let ((out, held), crc) = match made {
        Ok(made) => made,
        Err(e) => match e.get_ref().and_then(|e| e.downcast_ref::<OutOfRoom>()) {
            // A body that does not compress well enough to fit.
            Some(OutOfRoom { wanted }) if *wanted > limit => return Ok(None),
            Some(OutOfRoom { .. }) => return Err(NoRoomNow),
            None => {
                log_failure(&e);
                return Ok(None);
            }
        },
    };
    let bytes = out.len();
    let out = Bytes::from(out);
    let frames = (0..bytes)
        .step_by(KEPT_GZIP_FRAME_BYTES)
        .map(|at| out.slice(at..(at + KEPT_GZIP_FRAME_BYTES).min(bytes)))
        .collect();
    Ok(Some(GzipItems { frames, crc, held }))
}

/// The compressor's output, whose every byte of capacity is held in the
/// budget before it is allocated: a body that compresses worse than
/// [`RESERVE_DIVISOR`] grows its buffer (by half each time) only as far as
/// the budget allows, and is given up as soon as it would not fit, instead
/// of growing an uncounted buffer up to twice the body's size first.
pub(super) struct CountedVec {
    pub(super) out: Vec<u8>,
    /// Holds `out.capacity()` bytes.
    pub(super) held: Reservation,
}

/// What [`CountedVec`] fails a write with when the budget has no room for
/// the buffer it needs (carried in the `io::Error`, read back by type).
#[derive(Debug, thiserror::Error)]
#[error("no room in the List body budget for {wanted} bytes of gzip")]
pub(super) struct OutOfRoom {
    pub(super) wanted: usize,
}

impl CountedVec {
    pub(super) fn new(held: Reservation) -> CountedVec {
        CountedVec {
            out: Vec::with_capacity(held.bytes()),
            held,
        }
    }
}

impl Write for CountedVec {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let needed = self.out.len() + buf.len();
        if needed > self.out.capacity() {
            let wanted = needed.max(self.out.capacity() + self.out.capacity() / 2);
            if !self.held.resize(wanted) {
                return Err(io::Error::other(OutOfRoom { wanted }));
            }
            self.out.reserve_exact(wanted - self.out.len());
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Frames of kept gzip, as the kept frames themselves.
pub(super) const KEPT_GZIP_FRAME_BYTES: usize = 1 << 20;

pub(super) fn log_failure(error: &io::Error) {
    warn!(%error, "gzip of a response failed");
}
