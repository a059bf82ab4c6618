//! `Body`: the response body of every handler.
//!
//! The two shapes almost every response has live inline: a whole body in
//! one buffer (Gets, writes, errors), and a watch stream. A boxed body cost
//! an allocation per Get, and a watch one more pointer to follow on every
//! event it delivers (at 10,000 watches, each such hop is a cache miss per
//! delivery). Anything else (a streamed List) is boxed.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::{Frame, SizeHint};

use super::watch_stream::WatchBody;

pub enum Body {
    /// All of it, sent as one frame (`None` once sent).
    Full(Option<Bytes>),
    /// A watch stream.
    Watch(WatchBody),
    /// Anything else.
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
            Body::Boxed(b) => Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Full(b) => b.as_ref().is_none_or(|b| b.is_empty()),
            Body::Watch(w) => w.is_end_stream(),
            Body::Boxed(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Body::Watch(w) => w.size_hint(),
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

    #[tokio::test]
    async fn a_boxed_body_is_passed_through() {
        let b = Body::boxed(http_body_util::Full::new(Bytes::from_static(b"abc")));
        assert_eq!(&b.collect().await.unwrap().to_bytes()[..], b"abc");
    }
}
