//! Response compression: gzip for large responses, as kube-apiserver's
//! `APIResponseCompression` does.
//!
//! Why: a full List of a large resource is megabytes of JSON. Across a real
//! network (kubectl on a laptop, a controller in another zone) the bytes
//! cost more than the CPU to shrink them, and every Kubernetes client asks
//! for gzip (Go's transport adds `Accept-Encoding: gzip` by itself).
//! kube-apiserver's rules are kept: only a client that names `gzip` gets
//! it, only a body over [`THRESHOLD`] is compressed (small ones cost more
//! CPU than they save), at level 1 ([`LEVEL`]), with `Content-Encoding:
//! gzip` and `Vary: Accept-Encoding`; watch streams never are (each event
//! must leave at once). `server.response_compression = false` turns it off,
//! kube-apiserver's `--feature-gates=APIResponseCompression=false`.
//!
//! A streamed List is compressed as it is made, a frame at a time, on
//! tokio's blocking pool (deflating one of its 256 KiB or 1 MiB frames
//! takes a millisecond or more, too long for a runtime thread), by at most
//! as many threads at once as there are cores (`gzip`'s slots): a relist storm
//! of gzip clients queues for them instead of crowding out the runtime's
//! threads that deliver watch events. Nothing waits for the whole body,
//! and a client that goes away stops the compressor and the List's
//! producer.
//!
//! Only a request that may get gzip pays anything: [`candidate`] decides
//! without awaiting, so a small Get from a client that asks for gzip (Go's
//! transport asks on every request) takes no extra allocation.

use std::convert::Infallible;
use std::io::{self, Write};

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use flate2::write::GzEncoder;
use flate2::{Compression, Crc};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::header::{
    ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_LENGTH, HeaderMap, HeaderValue, VARY,
};
use hyper::{Response, StatusCode};
use tokio_stream::StreamExt;

use super::body::{Body, KeptBody};
use super::gzip::{GzipItems, LEVEL, blocking, log_failure};

/// Bodies up to this size go out as they are (kube-apiserver's
/// `defaultGzipThresholdBytes`).
pub const THRESHOLD: usize = 128 * 1024;

/// Whether the request's `Accept-Encoding` names `gzip` (and does not
/// refuse it with `q=0`). Like kube-apiserver, `*` does not count: a
/// client that cannot name gzip is not sent it. Unlike kube-apiserver
/// (which compares each token of the first header with `gzip` exactly),
/// every header is read, the name is compared without case, and
/// parameters are allowed, as RFC 9110 section 12.5.3 has it.
pub fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.split(';');
            let name = parts.next().unwrap_or_default().trim();
            name.eq_ignore_ascii_case("gzip") && !parts.any(refuses)
        })
}

/// `q=0` (or `q=0.0`...): the coding is not acceptable (RFC 9110 12.4.2).
fn refuses(param: &str) -> bool {
    let Some((k, v)) = param.split_once('=') else {
        return false;
    };
    k.trim().eq_ignore_ascii_case("q") && v.trim().parse::<f32>().is_ok_and(|q| q <= 0.0)
}

/// Whether [`compress`] may gzip `resp`: a status with content, not
/// already encoded, and a whole body over [`THRESHOLD`] or a streamed one
/// (a List: finite, see [`Body::Boxed`]). Never a watch.
pub fn candidate(resp: &Response<Body>) -> bool {
    let status = resp.status();
    let body = match resp.body() {
        Body::Full(Some(b)) => b.len() > THRESHOLD,
        Body::Kept(k) => k.len() > THRESHOLD,
        Body::Boxed(_) => true,
        Body::Full(None) | Body::Watch(_) => false,
    };
    body && status != StatusCode::NO_CONTENT
        && status != StatusCode::NOT_MODIFIED
        && !status.is_informational()
        && !resp.headers().contains_key(CONTENT_ENCODING)
}

/// `resp`, gzipped when it is worth it; the caller has checked
/// [`accepts_gzip`]. A response that is not a [`candidate`] comes back as
/// it is. A streamed body is read until it passes the threshold or ends,
/// which decides.
pub async fn compress(resp: Response<Body>) -> Response<Body> {
    if !candidate(&resp) {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let body = match body {
        Body::Full(Some(all)) => {
            let input = all.clone();
            match blocking(move || gzip_all(&input)).await {
                Ok(z) => {
                    counted(Source::Whole);
                    Body::full(z)
                }
                Err(e) => {
                    log_failure(&e);
                    return Response::from_parts(parts, Body::full(all));
                }
            }
        }
        Body::Kept(k) => match kept(k).await {
            Ok(gzipped) => gzipped,
            Err(as_is) => return Response::from_parts(parts, as_is),
        },
        Body::Boxed(rest) => match stream(rest).await {
            Ok(gzipped) => gzipped,
            Err(as_is) => return Response::from_parts(parts, as_is),
        },
        other => return Response::from_parts(parts, other),
    };
    parts.headers.remove(CONTENT_LENGTH);
    parts
        .headers
        .insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    parts
        .headers
        .append(VARY, HeaderValue::from_static("Accept-Encoding"));
    Response::from_parts(parts, body)
}

/// A streamed body gzipped (`Ok`), or as it is (`Err`) when it ends
/// within [`THRESHOLD`].
async fn stream(mut rest: UnsyncBoxBody<Bytes, Infallible>) -> Result<Body, Body> {
    let mut first = Vec::new();
    let mut seen = 0;
    while seen <= THRESHOLD {
        match next_data(&mut rest).await {
            Some(b) => {
                seen += b.len();
                first.push(b);
            }
            // All of it is here, and it is small: one frame as is.
            None => return Err(Body::full(concat(first))),
        }
    }
    counted(Source::Stream);
    Ok(gzip_stream(first, rest))
}

/// A List written from kept frames, gzipped: from their kept gzip when
/// there is one ([`spliced`]), else compressed as a stream.
async fn kept(k: KeptBody) -> Result<Body, Body> {
    // An unsent body (its head still there) is the whole List.
    if let Some(head) = &k.head
        && let Some(items) = k.frames.gzip().await
    {
        match spliced(head, items) {
            Ok(body) => {
                counted(Source::Kept);
                return Ok(body);
            }
            Err(e) => log_failure(&e),
        }
    }
    stream(UnsyncBoxBody::new(k)).await
}

/// How a response was gzipped (the `source` of
/// `watchcache_api_gzip_responses_total`).
#[derive(Clone, Copy)]
enum Source {
    Whole,
    Stream,
    Kept,
}

fn counted(source: Source) {
    let label = match source {
        Source::Whole => "whole",
        Source::Stream => "stream",
        Source::Kept => "kept",
    };
    crate::metrics::metrics()
        .api_gzip_responses
        .with_label_values(&[label])
        .inc();
}

/// The deflate stream's end: an empty last block (BFINAL set, fixed
/// Huffman codes, the end-of-block code alone; RFC 1951 3.2.3 and 3.2.6),
/// what flate2 writes to finish a stream with nothing pending (pinned by a
/// test). Written as is: making an encoder per response to get these two
/// bytes would allocate its whole state.
const LAST_BLOCK: [u8; 2] = [0x03, 0x00];

/// One gzip stream of `head` then `items`' frames: the gzip header and
/// `head` compressed (flate2's, ended with a sync flush), the kept blocks
/// as they are, an empty last block, and the trailer: the CRC-32 of the
/// whole (`head`'s combined with the items') and its length.
fn spliced(head: &Bytes, items: Arc<GzipItems>) -> io::Result<Body> {
    let mut first = GzEncoder::new(Vec::with_capacity(head.len() + 64), Compression::new(LEVEL));
    first.write_all(head)?;
    first.flush()?;
    let first = Bytes::from(std::mem::take(first.get_mut()));
    let mut crc = Crc::new();
    crc.update(head);
    crc.combine(&items.crc);
    let mut last = Vec::with_capacity(LAST_BLOCK.len() + 8);
    last.extend_from_slice(&LAST_BLOCK);
    last.extend_from_slice(&crc.sum().to_le_bytes());
    last.extend_from_slice(&crc.amount().to_le_bytes());
    let kept = (0..items.frames.len()).map(move |i| items.frames[i].clone());
    Ok(Body::boxed(http_body_util::StreamBody::new(
        tokio_stream::iter(
            std::iter::once(first)
                .chain(kept)
                .chain(std::iter::once(Bytes::from(last))),
        )
        .map(|b| Ok::<_, Infallible>(hyper::body::Frame::data(b))),
    )))
}

/// The next data frame of `body` (trailers are skipped; none are made).
async fn next_data(body: &mut UnsyncBoxBody<Bytes, Infallible>) -> Option<Bytes> {
    loop {
        match body.frame().await? {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    return Some(data);
                }
            }
            Err(never) => match never {},
        }
    }
}

fn concat(frames: Vec<Bytes>) -> Bytes {
    match <[Bytes; 1]>::try_from(frames) {
        Ok([one]) => one,
        Err(frames) => {
            let mut all = BytesMut::with_capacity(frames.iter().map(Bytes::len).sum());
            for f in &frames {
                all.extend_from_slice(f);
            }
            all.freeze()
        }
    }
}

fn encoder(capacity: usize) -> GzEncoder<Vec<u8>> {
    GzEncoder::new(Vec::with_capacity(capacity), Compression::new(LEVEL))
}

fn gzip_all(input: &[u8]) -> io::Result<Vec<u8>> {
    let mut enc = encoder(input.len() / 4);
    enc.write_all(input)?;
    enc.finish()
}

/// What one round of [`deflate`] leaves: the encoder to go on with and the
/// bytes made so far, or the last bytes.
enum Deflated {
    More(Box<GzEncoder<Vec<u8>>>, Vec<u8>),
    Done(Vec<u8>),
}

/// Compresses `input` and takes what the encoder has written; with `last`,
/// ends the gzip stream (the trailer with its CRC and length).
fn deflate(mut enc: Box<GzEncoder<Vec<u8>>>, input: &[Bytes], last: bool) -> io::Result<Deflated> {
    for b in input {
        enc.write_all(b)?;
    }
    if last {
        return enc.finish().map(Deflated::Done);
    }
    let made = std::mem::take(enc.get_mut());
    Ok(Deflated::More(enc, made))
}

/// The gzip of `first` then the rest of `rest`, made by a task of its own
/// (see the module's doc) at most a few frames ahead of the connection.
fn gzip_stream(first: Vec<Bytes>, mut rest: UnsyncBoxBody<Bytes, Infallible>) -> Body {
    let (tx, rx) = tokio::sync::mpsc::channel(super::body::PRODUCED_AHEAD);
    tokio::spawn(async move {
        let mut enc = Box::new(encoder(THRESHOLD));
        let mut batch = first;
        loop {
            // The producer runs ahead of us, so the next frame is usually
            // there already. A client gone meanwhile ends it all.
            let next = tokio::select! {
                next = next_data(&mut rest) => next,
                () = tx.closed() => return,
            };
            let last = next.is_none();
            let round = tokio::select! {
                round = blocking(move || deflate(enc, &batch, last).map(|d| (d, batch))) => round,
                () = tx.closed() => return,
            };
            let made = match round {
                Ok((Deflated::More(e, made), mut used)) => {
                    enc = e;
                    used.clear();
                    batch = used;
                    made
                }
                Ok((Deflated::Done(made), _)) => {
                    let _ = tx.send(Bytes::from(made)).await;
                    return;
                }
                // The client sees the gzip stream end without its trailer:
                // an error, never a short body taken for the whole.
                Err(e) => return log_failure(&e),
            };
            if !made.is_empty() && tx.send(Bytes::from(made)).await.is_err() {
                return; // The client went away.
            }
            // Not the last round, so there was a next frame.
            batch.extend(next);
        }
    });
    Body::from_receiver(rx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::response::gzip::{CountedVec, OutOfRoom, RESERVE_DIVISOR, deflate_items};
    use crate::api::response::writers;
    use flate2::write::DeflateEncoder;
    use std::io::Read;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(ACCEPT_ENCODING, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn gzip_is_taken_only_when_named_and_not_refused() {
        for yes in [
            &["gzip"][..],
            &["gzip, deflate, br"],
            &["br;q=1.0, GZIP;q=0.5"],
            &["deflate", "gzip"],
            &[" identity ,gzip ; q=0.001"],
        ] {
            assert!(accepts_gzip(&headers(yes)), "{yes:?}");
        }
        for no in [
            &[][..],
            &["identity"],
            &["*"],
            &["gzip;q=0"],
            &["gzip; q=0.000"],
            &["deflate, br"],
            &["gzipx"],
            &["x-gzip"],
        ] {
            assert!(!accepts_gzip(&headers(no)), "{no:?}");
        }
    }

    fn gunzip(b: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(b)
            .read_to_end(&mut out)
            .expect("a whole gzip stream");
        out
    }

    /// Distinct lines, so the test sees reordered or lost frames.
    fn payload(lines: usize) -> Vec<u8> {
        (0..lines)
            .flat_map(|i| {
                format!("{{\"item\":{i},\"pad\":\"{}\"}},\n", "x".repeat(i % 97)).into_bytes()
            })
            .collect()
    }

    async fn collect(resp: Response<Body>) -> (Response<()>, Vec<u8>) {
        let (parts, body) = resp.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes().to_vec();
        (Response::from_parts(parts, ()), bytes)
    }

    fn gzipped(resp: &Response<()>) -> bool {
        resp.headers().get(CONTENT_ENCODING).map(|v| v.as_bytes()) == Some(b"gzip")
    }

    #[tokio::test]
    async fn a_large_full_body_is_gzipped_and_a_small_one_is_not() {
        let big = payload(20_000);
        assert!(big.len() > THRESHOLD);
        let resp = writers::response(200, "application/json", Body::full(big.clone()));
        let (head, bytes) = collect(compress(resp).await).await;
        assert!(gzipped(&head));
        assert_eq!(head.headers()[VARY], "Accept-Encoding");
        assert!(bytes.len() < big.len() / 3, "{} bytes", bytes.len());
        assert_eq!(gunzip(&bytes), big);

        let small = Bytes::from(vec![b'a'; THRESHOLD]);
        let resp = writers::response(200, "application/json", Body::full(small.clone()));
        let (head, bytes) = collect(compress(resp).await).await;
        assert!(!gzipped(&head) && !head.headers().contains_key(VARY));
        assert_eq!(bytes, small);
    }

    /// A streamed body: the frames before the threshold and after it, in
    /// order, whatever their sizes; one that ends small goes out as is.
    #[tokio::test]
    async fn a_streamed_body_is_gzipped_whole_or_sent_as_is_when_small() {
        let all = payload(40_000);
        let sizes = [1usize, 7, 40_000, 100_000, 3, 300_000, 65_536];
        let mut frames = Vec::new();
        let mut at = 0;
        for s in sizes.iter().cycle() {
            if at == all.len() {
                break;
            }
            let end = (at + s).min(all.len());
            frames.push(Bytes::copy_from_slice(&all[at..end]));
            at = end;
        }
        let resp = writers::response(200, "application/json", Body::produced(frames.into_iter()));
        let (head, bytes) = collect(compress(resp).await).await;
        assert!(gzipped(&head));
        assert_eq!(gunzip(&bytes), all);

        let small = vec![
            Bytes::from_static(b"{\"items\":["),
            Bytes::from_static(b"]}"),
        ];
        let resp = writers::response(200, "application/json", Body::produced(small.into_iter()));
        let (head, bytes) = collect(compress(resp).await).await;
        assert!(!gzipped(&head));
        assert_eq!(bytes, b"{\"items\":[]}");
    }

    #[tokio::test]
    async fn no_content_and_encoded_bodies_are_left_alone() {
        let big = Bytes::from(payload(20_000));
        let mut resp = writers::response(200, "application/json", Body::full(big.clone()));
        resp.headers_mut()
            .insert(CONTENT_ENCODING, HeaderValue::from_static("br"));
        let (head, bytes) = collect(compress(resp).await).await;
        assert_eq!(head.headers()[CONTENT_ENCODING], "br");
        assert_eq!(bytes, big);

        let resp = writers::response(304, "application/json", Body::full(big.clone()));
        let (head, _) = collect(compress(resp).await).await;
        assert!(!gzipped(&head));
    }

    /// A List written from kept frames: their gzip is made once, kept in
    /// the budget, and each List's own head joined to it makes one valid
    /// gzip stream (its CRC checked by the decoder) of head and frames.
    #[tokio::test]
    async fn kept_frames_are_gzipped_once_and_joined_to_each_lists_head() {
        use crate::api::response::budget::ListBodyBudget;
        use crate::api::response::list_body_cache::KeptFrames;
        let varied = payload(30_000);
        let frames = vec![
            Bytes::from(varied[..1_500_000].to_vec()),
            Bytes::from_static(b",{\"small\":1}"),
            Bytes::from(vec![b'x'; 300_000]),
            Bytes::from(varied[1_500_000..].to_vec()),
            Bytes::from_static(b"]}"),
        ];
        let all: Vec<u8> = frames.concat();
        let budget = ListBodyBudget::new(64 << 20);
        let kept = Arc::new(KeptFrames::new(frames.clone(), budget.empty()));
        let items = kept.gzip().await.expect("made and kept");
        assert!(Arc::ptr_eq(&items, &kept.gzip().await.expect("kept")));
        assert_eq!(budget.used(), items.bytes());
        assert!(items.bytes() * 3 < all.len(), "{} bytes", items.bytes());

        for head in [
            &b"{\"kind\":\"PodList\",\"items\":["[..],
            b"",
            &varied[..200_000],
        ] {
            let head = Bytes::copy_from_slice(head);
            let resp = writers::response(
                200,
                "application/json",
                Body::kept(head.clone(), Arc::clone(&kept)),
            );
            let (parts, bytes) = collect(compress(resp).await).await;
            assert!(gzipped(&parts));
            let mut want = head.to_vec();
            want.extend_from_slice(&all);
            assert_eq!(gunzip(&bytes), want, "head of {} bytes", head.len());
            // Joined from the kept gzip, not compressed whole (which would
            // decode the same).
            let joined = spliced(&head, Arc::clone(&items)).expect("joined");
            assert_eq!(joined.collect().await.unwrap().to_bytes(), bytes);

            // One gzip member and nothing after it (Go's reader would take
            // trailing bytes for another member and fail).
            let mut one = flate2::bufread::GzDecoder::new(&bytes[..]);
            one.read_to_end(&mut Vec::new()).expect("one member");
            assert!(one.into_inner().is_empty(), "bytes after the trailer");

            // The decoder checks the joined CRC: a wrong one is an error.
            let mut bad = bytes.clone();
            let at = bad.len() - 8;
            bad[at] ^= 1;
            let mut out = Vec::new();
            assert!(
                flate2::read::GzDecoder::new(&bad[..])
                    .read_to_end(&mut out)
                    .is_err()
            );
        }
        // A response partly written from the kept gzip holds its bytes
        // after the kept frames are gone.
        let made = items.bytes();
        drop(items);
        let resp = writers::response(
            200,
            "application/json",
            Body::kept(Bytes::from_static(b"{"), Arc::clone(&kept)),
        );
        let mut writing = compress(resp).await.into_body();
        assert!(writing.frame().await.is_some());
        drop(kept);
        assert_eq!(budget.used(), made, "held while a response holds them");
        drop(writing);
        assert_eq!(
            budget.used(),
            0,
            "the gzip's bytes go back with the last holder"
        );

        // No kept frames at all (an empty List's tail is a frame, but the
        // join must not depend on it).
        let empty = Arc::new(KeptFrames::new(Vec::new(), budget.empty()));
        let head = Bytes::from(vec![b'h'; THRESHOLD + 1]);
        let resp = writers::response(200, "application/json", Body::kept(head.clone(), empty));
        let (parts, bytes) = collect(compress(resp).await).await;
        assert!(gzipped(&parts));
        assert_eq!(gunzip(&bytes), head);

        // Over the budget: not kept, and each List compressed on its own.
        let small = ListBodyBudget::new(1_000);
        let kept = Arc::new(KeptFrames::new(frames, small.empty()));
        assert!(kept.gzip().await.is_none());
        assert_eq!(small.used(), 0);
        let head = Bytes::from_static(b"{\"items\":[");
        let resp = writers::response(200, "application/json", Body::kept(head.clone(), kept));
        let (parts, bytes) = collect(compress(resp).await).await;
        assert!(gzipped(&parts));
        let mut want = head.to_vec();
        want.extend_from_slice(&all);
        assert_eq!(gunzip(&bytes), want);
    }

    /// The budget reserved for a kept gzip is given back when the List
    /// that makes it goes away midway (the kept frames' first gzip client
    /// hung up while it was being made): once the compression it started
    /// ends, since its buffer is held until then.
    #[tokio::test]
    async fn a_gzip_dropped_while_made_gives_its_reserve_back() {
        use crate::api::response::budget::ListBodyBudget;
        let budget = ListBodyBudget::new(64 << 20);
        let frames: Arc<[Bytes]> = vec![Bytes::from(payload(60_000))].into();
        let mut making = Box::pin(deflate_items(frames, &budget));
        assert!(futures::poll!(&mut making).is_pending());
        assert!(budget.used() > 0, "reserved while it is made");
        drop(making);
        let back = tokio::time::timeout(std::time::Duration::from_secs(30), async {
            while budget.used() != 0 {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(back.is_ok(), "still held: {}", budget.used());
    }

    /// A kept gzip whose first client goes away midway is still made, once:
    /// the next List finds it made.
    #[tokio::test]
    async fn a_kept_gzip_is_made_even_if_its_first_client_leaves() {
        use crate::api::response::budget::ListBodyBudget;
        use crate::api::response::list_body_cache::KeptFrames;
        let budget = ListBodyBudget::new(64 << 20);
        let kept = Arc::new(KeptFrames::new(
            vec![Bytes::from(payload(60_000))],
            budget.empty(),
        ));
        let mut first = Box::pin(kept.gzip());
        assert!(futures::poll!(&mut first).is_pending());
        drop(first);
        let made = tokio::time::timeout(std::time::Duration::from_secs(30), async {
            while !kept.gzip_made() {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(made.is_ok(), "made without a client waiting for it");
        let items = kept.gzip().await.expect("kept");
        assert_eq!(budget.used(), items.bytes(), "counted once");
    }

    /// Without room in the budget now, nothing is kept and a later List
    /// tries again; a gzip that can never fit is not tried again.
    #[tokio::test]
    async fn a_kept_gzip_without_room_now_is_tried_again_later() {
        use crate::api::response::budget::ListBodyBudget;
        use crate::api::response::list_body_cache::KeptFrames;
        let frames = vec![Bytes::from(payload(60_000))];
        let total: usize = frames.iter().map(Bytes::len).sum();
        let budget = ListBodyBudget::new(total);
        let kept = Arc::new(KeptFrames::new(frames.clone(), budget.empty()));
        let others = budget.reserve(total).expect("fits");
        assert!(kept.gzip().await.is_none());
        assert!(!kept.gzip_made());
        drop(others);
        let items = kept.gzip().await.expect("made once there is room");
        assert_eq!(budget.used(), items.bytes());

        let tiny = ListBodyBudget::new(total / RESERVE_DIVISOR - 1);
        let never = Arc::new(KeptFrames::new(frames, tiny.empty()));
        assert!(never.gzip().await.is_none());
        assert!(never.gzip_made(), "settled: not tried again");
        assert_eq!(tiny.used(), 0);
    }

    /// Bytes that deflate cannot shrink (xorshift64), so the output
    /// outgrows its first reserve.
    fn noise(n: usize) -> Vec<u8> {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    /// The compressor's buffer never holds more than the budget counts,
    /// and stops growing where the budget ends.
    #[test]
    fn the_gzip_buffer_grows_only_as_far_as_the_budget() {
        use crate::api::response::budget::ListBodyBudget;
        let budget = ListBodyBudget::new(100_000);
        let mut out = CountedVec::new(budget.reserve(10_000).expect("fits"));
        let chunk = [7u8; 3_000];
        let mut written = 0;
        let err = loop {
            match out.write(&chunk) {
                Ok(n) => written += n,
                Err(e) => break e,
            }
            assert_eq!(out.out.len(), written);
            assert_eq!(out.held.bytes(), out.out.capacity(), "every byte counted");
            assert_eq!(budget.used(), out.held.bytes());
        };
        let room = err
            .get_ref()
            .and_then(|e| e.downcast_ref::<OutOfRoom>())
            .expect("out of room, by type");
        assert!(room.wanted > budget.limit());
        assert!(out.out.capacity() <= budget.limit());
        assert!(written > 60_000, "grew past its first reserve: {written}");
        drop(out);
        assert_eq!(budget.used(), 0);
    }

    /// A body that compresses worse than the first reserve is kept when
    /// the budget has room for it, tried again later when others hold the
    /// room, and settled as none when it can never fit; the budget counts
    /// what is kept and nothing is left held.
    #[tokio::test]
    async fn a_kept_gzip_that_outgrows_its_reserve() {
        use crate::api::response::budget::ListBodyBudget;
        use crate::api::response::list_body_cache::KeptFrames;
        let frames = vec![Bytes::from(noise(600_000)), Bytes::from(noise(500_000))];
        let total: usize = frames.iter().map(Bytes::len).sum();

        let roomy = ListBodyBudget::new(4 * total);
        let kept = Arc::new(KeptFrames::new(frames.clone(), roomy.empty()));
        let items = kept.gzip().await.expect("fits");
        assert!(items.bytes() > total / RESERVE_DIVISOR, "{}", items.bytes());
        assert_eq!(roomy.used(), items.bytes());
        let head = Bytes::from_static(b"{\"items\":[");
        let joined = spliced(&head, Arc::clone(&items)).expect("joined");
        let mut want = head.to_vec();
        want.extend_from_slice(&frames.concat());
        assert_eq!(gunzip(&joined.collect().await.unwrap().to_bytes()), want);

        // The reserve fits, the growth does not while others hold room.
        let shared = ListBodyBudget::new(2 * total);
        let others = shared.reserve(total).expect("fits");
        let kept = Arc::new(KeptFrames::new(frames.clone(), shared.empty()));
        assert!(kept.gzip().await.is_none());
        assert!(!kept.gzip_made(), "tried again once there is room");
        assert_eq!(shared.used(), total, "nothing left held");
        drop(others);
        assert!(kept.gzip().await.is_some());

        // Never fits: the output alone is more than the whole budget.
        let small = ListBodyBudget::new(total / 2);
        let never = Arc::new(KeptFrames::new(frames, small.empty()));
        assert!(never.gzip().await.is_none());
        assert!(never.gzip_made(), "settled: not tried again");
        assert_eq!(small.used(), 0);
    }

    /// [`LAST_BLOCK`] is what flate2 itself ends a stream with.
    #[test]
    fn the_last_block_is_flate2s_own() {
        let end = DeflateEncoder::new(Vec::new(), Compression::new(LEVEL))
            .finish()
            .unwrap();
        assert_eq!(end, LAST_BLOCK);
    }

    /// A client that goes away stops the compressor, and so the producer.
    #[tokio::test]
    async fn a_dropped_body_stops_the_compressor_and_its_producer() {
        let made = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let m = std::sync::Arc::clone(&made);
        let frame = Bytes::from(payload(2_000));
        let endless = std::iter::repeat_with(move || {
            m.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            frame.clone()
        });
        let resp = writers::response(200, "application/json", Body::produced(endless));
        let resp = compress(resp).await;
        assert_eq!(resp.headers()[CONTENT_ENCODING], "gzip");
        let mut body = resp.into_body();
        assert!(body.frame().await.is_some());
        drop(body);
        let mut last = made.load(std::sync::atomic::Ordering::SeqCst);
        let mut still = 0;
        for _ in 0..100 {
            if still == 5 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            let now = made.load(std::sync::atomic::Ordering::SeqCst);
            if now == last {
                still += 1;
            } else {
                still = 0;
                last = now;
            }
        }
        // Bounded by what was queued ahead: the producer's channel, the
        // frame the compressor holds, its next, and the compressor's own
        // channel of output.
        let bound = 2 + 2 * crate::api::response::body::PRODUCED_AHEAD + 2;
        assert!(last <= bound, "{last} frames made for a reader of one");
    }
}
