//! `Body`: the response body of every handler.
//!
//! The two shapes almost every response has live inline: a whole body in
//! one buffer (Gets, writes, errors), and a watch stream. A boxed body cost
//! an allocation per Get, and a watch one more pointer to follow on every
//! event it delivers (at 10,000 watches, each such hop is a cache miss per
//! delivery). Anything else (a streamed List) is boxed.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::{Frame, SizeHint};
use tokio_stream::StreamExt;

use super::list_body_cache::KeptFrames;
use super::watch_stream::WatchBody;

pub enum Body {
    /// All of it, sent as one frame (`None` once sent).
    Full(Option<Bytes>),
    /// A watch stream.
    Watch(WatchBody),
    /// A List written from kept frames ([`Body::kept`]).
    Kept(KeptBody),
    /// Anything else: a streamed List. It must end on its own (no
    /// long-lived streams here): `compression::compress` may read its
    /// first frames before the response's head goes out.
    Boxed(UnsyncBoxBody<Bytes, Infallible>),
}

impl Body {
    /// `bytes` as the whole body.
    pub fn full(bytes: impl Into<Bytes>) -> Body {
        Body::Full(Some(bytes.into()))
    }

    /// Any other body.
    pub fn boxed<B>(body: B) -> Body
    where
        B: hyper::body::Body<Data = Bytes, Error = Infallible> + Send + 'static,
    {
        Body::Boxed(UnsyncBoxBody::new(body))
    }
}

/// Frames a [`Body::produced`] body's producer may have made and the
/// connection not yet taken.
pub(super) const PRODUCED_AHEAD: usize = 2;

impl Body {
    /// A body of `frames`, made on a task of their own, at most
    /// [`PRODUCED_AHEAD`] frames ahead of the connection. For a large List:
    /// its connection's streams all run in the connection's task
    /// (`stream_executor`), so frames made in the body itself would be made
    /// on the same core as they are written, one after the other; made
    /// here, the copy into the next frame overlaps the write of the last.
    /// The producer stops when the body is dropped (the client went away).
    pub fn produced<I>(frames: I) -> Body
    where
        I: Iterator<Item = Bytes> + Send + 'static,
    {
        let (tx, rx) = tokio::sync::mpsc::channel(PRODUCED_AHEAD);
        tokio::spawn(async move {
            for frame in frames {
                if tx.send(frame).await.is_err() {
                    return;
                }
            }
        });
        Body::from_receiver(rx)
    }

    /// The frames sent on `rx`'s channel, until its senders are gone.
    pub(super) fn from_receiver(rx: tokio::sync::mpsc::Receiver<Bytes>) -> Body {
        Body::boxed(http_body_util::StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(rx)
                .map(|b| Ok::<_, Infallible>(Frame::data(b))),
        ))
    }
}

impl Body {
    /// `head`, then frames kept from an earlier body (shared, not copied):
    /// a List written from the `ListBodyCache`. Nothing to make, so no
    /// producer task.
    pub fn kept(head: Bytes, frames: Arc<KeptFrames>) -> Body {
        Body::Kept(KeptBody {
            head: Some(head),
            frames,
            next: 0,
        })
    }
}

/// See [`Body::kept`]. Its own variant so `compression` can tell it apart:
/// its gzip is kept too.
pub struct KeptBody {
    /// This List's own head, until it is sent.
    pub(super) head: Option<Bytes>,
    pub(super) frames: Arc<KeptFrames>,
    /// The next of `frames` to send.
    next: usize,
}

impl KeptBody {
    /// Bytes left to send.
    pub(super) fn len(&self) -> usize {
        self.head.as_ref().map_or(0, Bytes::len)
            + self.frames[self.next.min(self.frames.len())..]
                .iter()
                .map(Bytes::len)
                .sum::<usize>()
    }
}

impl hyper::body::Body for KeptBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if let Some(head) = this.head.take() {
            return Poll::Ready(Some(Ok(Frame::data(head))));
        }
        let frame = this.frames.get(this.next).cloned();
        if frame.is_some() {
            this.next += 1;
        }
        Poll::Ready(frame.map(|f| Ok(Frame::data(f))))
    }

    fn is_end_stream(&self) -> bool {
        self.head.is_none() && self.next >= self.frames.len()
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Body::Full(b) => Poll::Ready(
                b.take()
                    .filter(|b| !b.is_empty())
                    .map(|b| Ok(Frame::data(b))),
            ),
            Body::Watch(w) => Pin::new(w).poll_frame(cx),
            Body::Kept(k) => Pin::new(k).poll_frame(cx),
            Body::Boxed(b) => Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Full(b) => b.as_ref().is_none_or(|b| b.is_empty()),
            Body::Watch(w) => w.is_end_stream(),
            Body::Kept(k) => k.is_end_stream(),
            Body::Boxed(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Body::Watch(w) => w.size_hint(),
            Body::Kept(k) => k.size_hint(),
            Body::Boxed(b) => b.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn a_full_body_is_one_frame_of_known_length() {
        let b = Body::full("hello");
        assert_eq!(hyper::body::Body::size_hint(&b).exact(), Some(5));
        assert!(!hyper::body::Body::is_end_stream(&b));
        let got = b.collect().await.unwrap().to_bytes();
        assert_eq!(&got[..], b"hello");
        let empty = Body::full(Bytes::new());
        assert!(hyper::body::Body::is_end_stream(&empty));
        assert_eq!(hyper::body::Body::size_hint(&empty).exact(), Some(0));
        assert!(empty.collect().await.unwrap().to_bytes().is_empty());
    }

    /// Every frame in order, and the producer stops once the body is gone.
    #[tokio::test]
    async fn a_produced_body_carries_every_frame_and_stops_with_its_reader() {
        let frames: Vec<Bytes> = (0..50).map(|i| Bytes::from(format!("{i},"))).collect();
        let want: Vec<u8> = frames.iter().flat_map(|b| b.to_vec()).collect();
        let got = Body::produced(frames.into_iter())
            .collect()
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(&got[..], &want[..]);

        let made = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let m = std::sync::Arc::clone(&made);
        let endless = std::iter::repeat_with(move || {
            m.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Bytes::from_static(b"x")
        });
        let mut body = Body::produced(endless);
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"x");
        drop(body);
        // The producer ends: the count stops growing, bounded by what was
        // queued ahead.
        let mut last = made.load(std::sync::atomic::Ordering::SeqCst);
        for _ in 0..50 {
            tokio::task::yield_now().await;
            let now = made.load(std::sync::atomic::Ordering::SeqCst);
            if now == last {
                break;
            }
            last = now;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let end = made.load(std::sync::atomic::Ordering::SeqCst);
        assert!(
            end <= 1 + PRODUCED_AHEAD + 2,
            "{end} frames made for a reader of 1"
        );
    }

    #[tokio::test]
    async fn a_kept_body_is_its_head_then_its_frames() {
        let frames = KeptFrames::new(
            vec![Bytes::from_static(b"{\"a\":1}"), Bytes::from_static(b"]}")],
            super::super::budget::ListBodyBudget::new(1 << 20).empty(),
        );
        let mut b = Body::kept(Bytes::from_static(b"{\"items\":["), Arc::new(frames));
        let Body::Kept(k) = &b else {
            panic!("its own variant")
        };
        assert!(k.head.is_some());
        assert_eq!(k.len(), 19);
        let mut got = Vec::new();
        while let Some(f) = b.frame().await {
            got.push(f.unwrap().into_data().unwrap());
        }
        assert_eq!(got, [&b"{\"items\":["[..], b"{\"a\":1}", b"]}"]);
        assert!(hyper::body::Body::is_end_stream(&b));
    }

    #[tokio::test]
    async fn a_boxed_body_is_passed_through() {
        let b = Body::boxed(http_body_util::Full::new(Bytes::from_static(b"abc")));
        assert_eq!(&b.collect().await.unwrap().to_bytes()[..], b"abc");
    }
}
