//! A small HTTP client for the proxy: HTTP/2 with prior knowledge (h2c), many
//! streams over few connections as Kubernetes clients do, or HTTP/1.1 with
//! one connection per concurrent request; over TLS with a bearer token when
//! the proxy serves securely (`--secure`, [`crate::secure`]).

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper::header::HeaderValue;
use hyper::{Request, Response, Uri};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::ServerName;

use crate::secure::ClientTls;

/// Where the proxy listens, from a URL like `http://127.0.0.1:8080`.
#[derive(Debug, Clone)]
pub struct HttpTarget {
    /// `host:port`.
    pub authority: String,
    pub http1: bool,
    /// TLS and the bearer token, for a secure proxy.
    pub tls: Option<Arc<ClientTls>>,
    /// The `Accept` header of every GET ([`JSON`] unless set).
    pub accept: &'static str,
}

/// kube-apiserver's JSON media type.
pub const JSON: &str = "application/json";
/// kube-apiserver's protobuf media type (built-in types only).
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

impl HttpTarget {
    pub fn parse(url: &str, http1: bool) -> Result<HttpTarget> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| anyhow!("proxy URL {url:?}: want http://HOST:PORT"))?;
        let authority = rest.trim_end_matches('/').to_string();
        if !authority.contains(':') {
            bail!("proxy URL {url:?}: missing port");
        }
        Ok(HttpTarget {
            authority,
            http1,
            tls: None,
            accept: JSON,
        })
    }

    /// The same target asking for `accept` ([`JSON`] or [`PROTOBUF`]).
    pub fn with_accept(mut self, accept: &'static str) -> HttpTarget {
        self.accept = accept;
        self
    }

    /// The same target over TLS with `tls`'s token.
    pub fn with_tls(mut self, tls: Option<Arc<ClientTls>>) -> HttpTarget {
        self.tls = tls;
        self
    }

    async fn tcp(&self) -> Result<tokio::net::TcpStream> {
        let s = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::net::TcpStream::connect(&self.authority),
        )
        .await
        .map_err(|_| anyhow!("connecting to {}: timed out", self.authority))?
        .with_context(|| format!("connecting to {}", self.authority))?;
        let _ = s.set_nodelay(true);
        Ok(s)
    }

    /// A new connection of the configured protocol.
    pub async fn connect(&self) -> Result<Conn> {
        let tcp = self.tcp().await?;
        let Some(tls) = &self.tls else {
            let send = self.handshake(TokioIo::new(tcp)).await?;
            return Ok(Conn {
                send,
                authority: self.authority.clone(),
                scheme: "http",
                authorization: None,
                accept: self.accept,
                gzip: false,
            });
        };
        let host = self
            .authority
            .rsplit_once(':')
            .map(|(h, _)| h.trim_start_matches('[').trim_end_matches(']'))
            .unwrap_or(&self.authority);
        let name = ServerName::try_from(host.to_string())
            .map_err(|_| anyhow!("{host:?} is not a TLS server name"))?;
        let connector = if self.http1 { &tls.h1 } else { &tls.h2 };
        let stream = tokio::time::timeout(Duration::from_secs(10), connector.connect(name, tcp))
            .await
            .map_err(|_| anyhow!("TLS handshake with {}: timed out", self.authority))?
            .with_context(|| format!("TLS handshake with {}", self.authority))?;
        let send = self.handshake(TokioIo::new(stream)).await?;
        Ok(Conn {
            send,
            authority: self.authority.clone(),
            scheme: "https",
            authorization: tls.authorization.clone(),
            accept: self.accept,
            gzip: false,
        })
    }

    /// The HTTP handshake of the configured protocol on `io`.
    async fn handshake<T>(&self, io: TokioIo<T>) -> Result<Sender>
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        if self.http1 {
            let (send, conn) = http1::handshake(io).await.context("HTTP/1.1 handshake")?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok(Sender::H1(send))
        } else {
            let (send, conn) = http2::Builder::new(TokioExecutor::new())
                .initial_stream_window_size(1 << 20)
                .initial_connection_window_size(16 << 20)
                .max_frame_size(1 << 20)
                .handshake(io)
                .await
                .context("HTTP/2 handshake")?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok(Sender::H2(send))
        }
    }

    /// `n` connections to share: for HTTP/2 each is multiplexed by
    /// [`Conn::share`]; for HTTP/1.1 the pool is empty and callers connect
    /// per request stream.
    pub async fn pool(&self, n: usize) -> Result<Pool> {
        let mut conns = Vec::new();
        if !self.http1 {
            for _ in 0..n.max(1) {
                conns.push(self.connect().await?);
            }
        }
        Ok(Pool {
            target: self.clone(),
            conns,
        })
    }
}

/// The request half of a connection.
enum Sender {
    H1(http1::SendRequest<Empty<Bytes>>),
    H2(http2::SendRequest<Empty<Bytes>>),
}

/// One client connection.
pub struct Conn {
    send: Sender,
    authority: String,
    scheme: &'static str,
    /// `Bearer <token>` on every request (secure proxy).
    authorization: Option<HeaderValue>,
    accept: &'static str,
    /// `Accept-Encoding: gzip` on every request ([`Conn::asking_gzip`]).
    gzip: bool,
}

impl Conn {
    /// Another handle on the same HTTP/2 connection (`None` for HTTP/1.1).
    pub fn share(&self) -> Option<Conn> {
        match &self.send {
            Sender::H2(s) => Some(Conn {
                send: Sender::H2(s.clone()),
                authority: self.authority.clone(),
                scheme: self.scheme,
                authorization: self.authorization.clone(),
                accept: self.accept,
                gzip: self.gzip,
            }),
            Sender::H1(..) => None,
        }
    }

    /// The same connection, asking for gzip on every request as kubectl
    /// and client-go do (`list --gzip`). Bodies that come back gzipped are
    /// unpacked by [`Conn::get_body`] and [`Conn::get_count`].
    pub fn asking_gzip(mut self) -> Conn {
        self.gzip = true;
        self
    }

    /// The request target of `GET path_and_query` on this connection: the
    /// path for HTTP/1.1 (with a `Host` header), the absolute URI for
    /// HTTP/2. Parsed once, a target is cheap to clone for every request
    /// ([`Conn::get_uri`]), so a load loop measures the server, not URI
    /// parsing.
    pub fn uri(&self, path_and_query: &str) -> Result<Uri> {
        Ok(match &self.send {
            Sender::H1(_) => path_and_query.parse()?,
            Sender::H2(_) => {
                format!("{}://{}{path_and_query}", self.scheme, self.authority).parse()?
            }
        })
    }

    /// Sends `GET path_and_query` and returns the response head (body unread).
    pub async fn get(&mut self, path_and_query: &str) -> Result<Response<Incoming>> {
        let uri = self.uri(path_and_query)?;
        self.get_uri(uri).await
    }

    /// Sends `GET uri` (from [`Conn::uri`]) and returns the response head.
    pub async fn get_uri(&mut self, uri: Uri) -> Result<Response<Incoming>> {
        let mut req = match &self.send {
            Sender::H1(_) => Request::get(uri).header(hyper::header::HOST, self.authority.as_str()),
            Sender::H2(_) => Request::get(uri),
        }
        .header(hyper::header::ACCEPT, self.accept);
        if self.gzip {
            req = req.header(hyper::header::ACCEPT_ENCODING, "gzip");
        }
        if let Some(a) = &self.authorization {
            req = req.header(hyper::header::AUTHORIZATION, a.clone());
        }
        let req = req.body(Empty::new())?;
        match &mut self.send {
            Sender::H1(s) => {
                s.ready().await.context("HTTP/1.1 connection closed")?;
                Ok(s.send_request(req).await?)
            }
            Sender::H2(s) => {
                s.ready().await.context("HTTP/2 connection closed")?;
                Ok(s.send_request(req).await?)
            }
        }
    }

    /// `GET` and read the whole body; errors on a non-2xx status.
    pub async fn get_body(&mut self, path_and_query: &str) -> Result<Bytes> {
        let uri = self.uri(path_and_query)?;
        self.get_body_uri(uri).await
    }

    /// [`Conn::get_body`] of a target from [`Conn::uri`].
    pub async fn get_body_uri(&mut self, uri: Uri) -> Result<Bytes> {
        let resp = self.get_uri(uri.clone()).await?;
        let status = resp.status();
        let gzipped = is_gzipped(&resp);
        let body = resp.into_body().collect().await?.to_bytes();
        let body = if gzipped {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(&body[..])
                .read_to_end(&mut out)
                .with_context(|| format!("GET {uri}: gzip body"))?;
            Bytes::from(out)
        } else {
            body
        };
        if !status.is_success() {
            bail!(
                "GET {uri}: {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(300)])
            );
        }
        Ok(body)
    }

    /// `GET` and count the body's bytes without keeping them, unpacking a
    /// gzipped body as it comes (a client's work too, so it is timed):
    /// (bytes received, bytes of the body). Errors on a non-2xx status.
    pub async fn get_count(&mut self, path_and_query: &str) -> Result<(u64, u64)> {
        let resp = self.get(path_and_query).await?;
        let status = resp.status();
        if !status.is_success() {
            let body = resp.into_body().collect().await?.to_bytes();
            bail!(
                "GET {path_and_query}: {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(300)])
            );
        }
        let mut unpack = is_gzipped(&resp).then(|| flate2::write::GzDecoder::new(Counter(0)));
        let mut body = resp.into_body();
        let mut n = 0u64;
        while let Some(frame) = body.frame().await {
            if let Ok(d) = frame?.into_data() {
                n += d.len() as u64;
                if let Some(u) = &mut unpack {
                    u.write_all(&d).context("gzip body")?;
                }
            }
        }
        match unpack {
            Some(u) => Ok((n, u.finish().context("gzip body")?.0)),
            None => Ok((n, n)),
        }
    }
}

impl Conn {
    /// `GET` and count the body's bytes (not unpacked) without keeping them,
    /// but for its first `head` bytes: (bytes, the first bytes). Errors on
    /// a non-2xx status.
    pub async fn get_count_head(
        &mut self,
        path_and_query: &str,
        head: usize,
    ) -> Result<(u64, Vec<u8>)> {
        let resp = self.get(path_and_query).await?;
        let status = resp.status();
        if !status.is_success() {
            let body = resp.into_body().collect().await?.to_bytes();
            bail!(
                "GET {path_and_query}: {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(300)])
            );
        }
        let mut body = resp.into_body();
        let (mut n, mut first) = (0u64, Vec::new());
        while let Some(frame) = body.frame().await {
            if let Ok(d) = frame?.into_data() {
                n += d.len() as u64;
                if first.len() < head {
                    let take = (head - first.len()).min(d.len());
                    first.extend_from_slice(&d[..take]);
                }
            }
        }
        Ok((n, first))
    }

    /// Opens a WatchList (`sendInitialEvents=true`) of `path` and reads
    /// it, unpacking gzip as it comes, until the initial-events-end
    /// bookmark; then drops it (this connection is done with it):
    /// (bytes received, bytes of the stream, whether it came gzipped).
    pub async fn watch_list_count(mut self, path: &str) -> Result<(u64, u64, bool)> {
        const END: &[u8] = b"k8s.io/initial-events-end";
        let q = format!(
            "{path}?watch=1&sendInitialEvents=true&allowWatchBookmarks=true\
             &resourceVersionMatch=NotOlderThan"
        );
        let resp = self.get(&q).await?;
        if !resp.status().is_success() {
            bail!("GET {q}: {}", resp.status());
        }
        let gzipped = is_gzipped(&resp);
        let mut unpack = gzipped.then(|| flate2::write::GzDecoder::new(Vec::new()));
        let mut body = resp.into_body();
        let (mut wire, mut plain) = (0u64, 0u64);
        // The last bytes seen, for a marker split across frames.
        let mut tail: Vec<u8> = Vec::new();
        while let Some(frame) = body.frame().await {
            let Ok(d) = frame?.into_data() else { continue };
            wire += d.len() as u64;
            let data = match &mut unpack {
                Some(u) => {
                    u.write_all(&d).context("gzip stream")?;
                    u.flush().context("gzip stream")?;
                    Bytes::from(std::mem::take(u.get_mut()))
                }
                None => d,
            };
            plain += data.len() as u64;
            tail.extend_from_slice(&data);
            if tail.windows(END.len()).any(|w| w == END) {
                return Ok((wire, plain, gzipped));
            }
            let keep = tail.len().min(END.len() - 1);
            tail.drain(..tail.len() - keep);
        }
        bail!("GET {q}: ended before its initial-events-end bookmark")
    }
}

fn is_gzipped<B>(resp: &Response<B>) -> bool {
    resp.headers()
        .get(hyper::header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes() == b"gzip")
}

/// An `io::Write` that only counts.
struct Counter(u64);

impl std::io::Write for Counter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0 += b.len() as u64;
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Connections to the proxy shared by many request streams.
pub struct Pool {
    pub target: HttpTarget,
    conns: Vec<Conn>,
}

impl Pool {
    /// A connection handle for stream `i`: a share of HTTP/2 connection
    /// `i % n`, or a new HTTP/1.1 connection.
    pub async fn conn(&self, i: usize) -> Result<Conn> {
        if self.conns.is_empty() {
            return self.target.connect().await;
        }
        self.conns[i % self.conns.len()]
            .share()
            .ok_or_else(|| anyhow!("pool holds no HTTP/2 connection"))
    }

    /// Number of TCP connections held (0 for HTTP/1.1, which dials per stream).
    pub fn len(&self) -> usize {
        self.conns.len()
    }
}

/// A one-shot plain HTTP/1.1 GET on a fresh connection: (status, body).
pub async fn get_once(authority: &str, path: &str) -> Result<(u16, Bytes)> {
    get_once_with(authority, None, path).await
}

/// A one-shot HTTP/1.1 GET on a fresh connection, over TLS with the token
/// when `tls` is given: (status, body).
pub async fn get_once_with(
    authority: &str,
    tls: Option<Arc<ClientTls>>,
    path: &str,
) -> Result<(u16, Bytes)> {
    let t = HttpTarget {
        authority: authority.to_string(),
        http1: true,
        tls,
        accept: JSON,
    };
    let mut c = t.connect().await?;
    let resp = c.get(path).await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, body))
}
