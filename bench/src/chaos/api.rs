//! The chaos clients' view of the daemon's Kubernetes API: one HTTP/1.1
//! connection per request (a daemon restart breaks nothing shared), JSON
//! parsed with serde_json (the chaos rates are low), objects compared without
//! the `metadata.resourceVersion` the daemon injects.

use std::time::Duration;

use anyhow::{Result, anyhow};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::Value;

use super::checker::{Item, Selection};

/// The pods of one namespace on one daemon.
#[derive(Debug, Clone)]
pub struct Api {
    pub authority: String,
    pub namespace: String,
}

/// An object's name, resourceVersion, and the object without the latter.
pub fn split_object(mut obj: Value) -> Option<Item> {
    let name = obj["metadata"]["name"].as_str()?.to_string();
    let rv = obj["metadata"]["resourceVersion"].as_str()?.parse().ok()?;
    obj["metadata"].as_object_mut()?.remove("resourceVersion");
    Some((name, rv, obj))
}

/// A complete (all pages) List: its resourceVersion and items.
pub type ListResult = (i64, Vec<Item>);

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("HTTP {0}: {1}")]
    Status(u16, String),
    #[error("{0}")]
    Transport(String),
}

impl ApiError {
    pub fn code(&self) -> Option<u16> {
        match self {
            ApiError::Status(c, _) => Some(*c),
            ApiError::Transport(_) => None,
        }
    }
}

fn enc(s: &str) -> String {
    let mut o = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            o.push(b as char);
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}

impl Api {
    fn base(&self) -> String {
        format!("/api/v1/namespaces/{}/pods", self.namespace)
    }

    /// Sends one request on a new connection; returns the response head.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Response<Incoming>, ApiError> {
        let t = |e: String| ApiError::Transport(e);
        let stream = tokio::time::timeout(
            Duration::from_secs(5),
            tokio::net::TcpStream::connect(&self.authority),
        )
        .await
        .map_err(|_| t("connect timed out".into()))?
        .map_err(|e| t(format!("connect: {e}")))?;
        let (mut send, conn) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| t(format!("handshake: {e}")))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut b = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, self.authority.as_str())
            .header(hyper::header::ACCEPT, "application/json");
        if body.is_some() {
            b = b.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        let req = b
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| t(e.to_string()))?;
        tokio::time::timeout(Duration::from_secs(30), send.send_request(req))
            .await
            .map_err(|_| t("request timed out".into()))?
            .map_err(|e| t(format!("request: {e}")))
    }

    /// A request whose whole body is read; non-2xx statuses are errors.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Value, ApiError> {
        let resp = self.send(method, path, body).await?;
        let status = resp.status().as_u16();
        let bytes = tokio::time::timeout(Duration::from_secs(30), resp.into_body().collect())
            .await
            .map_err(|_| ApiError::Transport("reading the body timed out".into()))?
            .map_err(|e| ApiError::Transport(format!("body: {e}")))?
            .to_bytes();
        if !(200..300).contains(&status) {
            let msg = String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).to_string();
            return Err(ApiError::Status(status, msg));
        }
        serde_json::from_slice(&bytes).map_err(|e| ApiError::Transport(format!("JSON: {e}")))
    }

    /// A Get: from the cache at any age (`cached`, resourceVersion=0) or
    /// the most recent (a consistent read).
    pub async fn get(&self, name: &str, cached: bool) -> Result<Value, ApiError> {
        let q = if cached { "?resourceVersion=0" } else { "" };
        self.call(Method::GET, &format!("{}/{name}{q}", self.base()), None)
            .await
    }

    pub async fn create(&self, obj: &Value) -> Result<Value, ApiError> {
        self.call(
            Method::POST,
            &self.base(),
            Some(obj.to_string().into_bytes()),
        )
        .await
    }

    pub async fn replace(&self, name: &str, obj: &Value) -> Result<Value, ApiError> {
        self.call(
            Method::PUT,
            &format!("{}/{name}", self.base()),
            Some(obj.to_string().into_bytes()),
        )
        .await
    }

    /// A List of `sel`, in pages of `limit` (0: one page) at the first page's
    /// resourceVersion; `rv` sets the first page's resourceVersion (None: a
    /// consistent read).
    pub async fn list(
        &self,
        sel: &Selection,
        limit: usize,
        rv: Option<(i64, &str)>,
    ) -> Result<ListResult, ApiError> {
        let mut items = Vec::new();
        let mut cont: Option<String> = None;
        let mut list_rv: Option<i64> = None;
        loop {
            let mut q: Vec<String> = Vec::new();
            if let Some(l) = sel.label_selector() {
                q.push(format!("labelSelector={}", enc(&l)));
            }
            if limit > 0 {
                q.push(format!("limit={limit}"));
            }
            match (&cont, rv) {
                (Some(c), _) => q.push(format!("continue={}", enc(c))),
                (None, Some((rv, m))) => {
                    q.push(format!("resourceVersion={rv}"));
                    q.push(format!("resourceVersionMatch={m}"));
                }
                (None, None) => {}
            }
            let path = format!("{}?{}", self.base(), q.join("&"));
            let v = self.call(Method::GET, &path, None).await?;
            let page_rv: i64 = v["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| ApiError::Transport("list without resourceVersion".into()))?;
            list_rv.get_or_insert(page_rv);
            for it in v["items"].as_array().into_iter().flatten() {
                let o = split_object(it.clone())
                    .ok_or_else(|| ApiError::Transport("list item without name or RV".into()))?;
                items.push(o);
            }
            match v["metadata"]["continue"].as_str() {
                Some(c) if !c.is_empty() && limit > 0 => cont = Some(c.to_string()),
                _ => break,
            }
        }
        let rv = list_rv.ok_or_else(|| ApiError::Transport("empty list".into()))?;
        Ok((rv, items))
    }

    /// Opens a watch of `sel` from resourceVersion `from` with bookmarks.
    pub async fn watch(
        &self,
        sel: &Selection,
        from: i64,
        timeout_s: u64,
    ) -> Result<Response<Incoming>, ApiError> {
        let mut path = format!(
            "{}?watch=1&allowWatchBookmarks=true&resourceVersion={from}&timeoutSeconds={timeout_s}",
            self.base()
        );
        if let Some(l) = sel.label_selector() {
            path.push_str(&format!("&labelSelector={}", enc(&l)));
        }
        let resp = self.send(Method::GET, &path, None).await?;
        let status = resp.status().as_u16();
        if status != 200 {
            let body = resp
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            return Err(ApiError::Status(
                status,
                String::from_utf8_lossy(&body[..body.len().min(300)]).to_string(),
            ));
        }
        Ok(resp)
    }

    /// `/readyz` answers 200.
    pub async fn ready(&self) -> bool {
        matches!(
            tokio::time::timeout(
                Duration::from_secs(2),
                crate::http::get_once(&self.authority, "/readyz")
            )
            .await,
            Ok(Ok((200, _)))
        )
    }

    /// Waits until `/readyz` answers 200.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        while !self.ready().await {
            if tokio::time::Instant::now() >= deadline {
                return Err(anyhow!(
                    "daemon at {} not ready after {timeout:?}",
                    self.authority
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }
}
