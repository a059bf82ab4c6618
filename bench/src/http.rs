//! A small HTTP client for the proxy: HTTP/2 with prior knowledge (h2c), many
//! streams over few connections as Kubernetes clients do, or HTTP/1.1 with
//! one connection per concurrent request.

use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};

/// Where the proxy listens, from a URL like `http://127.0.0.1:8080`.
#[derive(Debug, Clone)]
pub struct HttpTarget {
    /// `host:port`.
    pub authority: String,
    pub http1: bool,
}

impl HttpTarget {
    pub fn parse(url: &str, http1: bool) -> Result<HttpTarget> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| anyhow!("proxy URL {url:?}: want http://HOST:PORT"))?;
        let authority = rest.trim_end_matches('/').to_string();
        if !authority.contains(':') {
            bail!("proxy URL {url:?}: missing port");
        }
        Ok(HttpTarget { authority, http1 })
    }

    async fn tcp(&self) -> Result<TokioIo<tokio::net::TcpStream>> {
        let s = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::net::TcpStream::connect(&self.authority),
        )
        .await
        .map_err(|_| anyhow!("connecting to {}: timed out", self.authority))?
        .with_context(|| format!("connecting to {}", self.authority))?;
        let _ = s.set_nodelay(true);
        Ok(TokioIo::new(s))
    }

    /// A new connection of the configured protocol.
    pub async fn connect(&self) -> Result<Conn> {
        let io = self.tcp().await?;
        if self.http1 {
            let (send, conn) = http1::handshake(io).await.context("HTTP/1.1 handshake")?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok(Conn::H1(send, self.authority.clone()))
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
            Ok(Conn::H2(send, self.authority.clone()))
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

/// One client connection.
pub enum Conn {
    H1(http1::SendRequest<Empty<Bytes>>, String),
    H2(http2::SendRequest<Empty<Bytes>>, String),
}

impl Conn {
    /// Another handle on the same HTTP/2 connection (`None` for HTTP/1.1).
    pub fn share(&self) -> Option<Conn> {
        match self {
            Conn::H2(s, a) => Some(Conn::H2(s.clone(), a.clone())),
            Conn::H1(..) => None,
        }
    }

    /// Sends `GET path_and_query` and returns the response head (body unread).
    pub async fn get(&mut self, path_and_query: &str) -> Result<Response<Incoming>> {
        match self {
            Conn::H1(s, authority) => {
                let req = Request::get(path_and_query)
                    .header(hyper::header::HOST, authority.as_str())
                    .header(hyper::header::ACCEPT, "application/json")
                    .body(Empty::new())?;
                s.ready().await.context("HTTP/1.1 connection closed")?;
                Ok(s.send_request(req).await?)
            }
            Conn::H2(s, authority) => {
                let req = Request::get(format!("http://{authority}{path_and_query}"))
                    .header(hyper::header::ACCEPT, "application/json")
                    .body(Empty::new())?;
                s.ready().await.context("HTTP/2 connection closed")?;
                Ok(s.send_request(req).await?)
            }
        }
    }

    /// `GET` and read the whole body; errors on a non-2xx status.
    pub async fn get_body(&mut self, path_and_query: &str) -> Result<Bytes> {
        let resp = self.get(path_and_query).await?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        if !status.is_success() {
            bail!(
                "GET {path_and_query}: {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(300)])
            );
        }
        Ok(body)
    }

    /// `GET` and count the body's bytes without keeping them; errors on a
    /// non-2xx status.
    pub async fn get_count(&mut self, path_and_query: &str) -> Result<u64> {
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
        let mut n = 0u64;
        while let Some(frame) = body.frame().await {
            if let Ok(d) = frame?.into_data() {
                n += d.len() as u64;
            }
        }
        Ok(n)
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

/// A one-shot HTTP/1.1 GET on a fresh connection: (status, body).
pub async fn get_once(authority: &str, path: &str) -> Result<(u16, Bytes)> {
    let t = HttpTarget {
        authority: authority.to_string(),
        http1: true,
    };
    let mut c = t.connect().await?;
    let resp = c.get(path).await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, body))
}
