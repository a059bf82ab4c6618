//! How long a Get waits behind a selector List on the same HTTP/2
//! connection (client-go and kubectl send every request of a client over
//! one connection, so an informer's List shares it with its watches).
//!
//! Against a running daemon (h2c) that holds the bench's Pods, e.g. `make
//! run`, then `watchcache-bench list --target proxy --etcd <its etcd> --proxy
//! http://127.0.0.1:8080 -n 100000 --iterations 1` to load them:
//!
//! ```sh
//! cargo run --release -p watchcache-bench --example hol -- 127.0.0.1:8080
//! cargo run --release -p watchcache-bench --example hol -- 127.0.0.1:8080 watch
//! ```
//!
//! Each of 30 rounds times a Get alone, then a List whose selector no index
//! answers (every object is walked, none matches) and the same Get sent
//! right after it on the same connection; it prints the medians and the
//! Get's p90. With `watch`, the request in front is a watch from
//! resourceVersion=0 with the same selector (its initial events walk the
//! cache the same way; it does not end, so only the Get is timed).

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};

const ROUNDS: usize = 30;
const BASE: &str = "/api/v1/namespaces/watchcache-bench/pods";

/// Sends a GET of `path` now; the returned future gives the milliseconds
/// from now to its body's last byte. The request is queued on the connection
/// before this returns, so requests go out in the order of the calls.
fn timed_get(
    send: &mut SendRequest<Empty<Bytes>>,
    path: &str,
) -> Result<impl std::future::Future<Output = Result<f64>> + use<>> {
    let t = Instant::now();
    let req = Request::get(format!("http://watchcache{path}")).body(Empty::new())?;
    let resp = send.send_request(req);
    let path = path.to_string();
    Ok(async move {
        let resp = resp.await.context("GET")?;
        anyhow::ensure!(resp.status().is_success(), "GET {path}: {}", resp.status());
        resp.into_body().collect().await?;
        Ok(t.elapsed().as_secs_f64() * 1e3)
    })
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q) as usize]
}

#[tokio::main]
async fn main() -> Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8080".into());
    let tcp = tokio::net::TcpStream::connect(&addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    // As every HTTP/2 client does: no Nagle delay on small frames.
    tcp.set_nodelay(true)?;
    let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(1 << 20)
        .initial_connection_window_size(16 << 20)
        .handshake(TokioIo::new(tcp))
        .await?;
    tokio::spawn(conn);
    // `watch`: the request in front is a watch from resourceVersion=0 with
    // the same selector, whose initial events walk the cache the same way.
    let watch = std::env::args().nth(2).as_deref() == Some("watch");
    let get = format!("{BASE}/obj-000001?resourceVersion=0");
    let list = if watch {
        format!("{BASE}?watch=1&resourceVersion=0&fieldSelector=metadata.name%3Dnothing")
    } else {
        format!("{BASE}?resourceVersion=0&fieldSelector=metadata.name%3Dnothing")
    };
    let (mut alone, mut behind, mut lists) = (Vec::new(), Vec::new(), Vec::new());
    let mut send = send;
    for _ in 0..ROUNDS {
        alone.push(timed_get(&mut send, &get)?.await?);
        // The List's request first, then the Get's, on the same connection.
        let l = tokio::spawn(timed_get(&mut send, &list)?);
        behind.push(timed_get(&mut send, &get)?.await?);
        if watch {
            // A watch does not end: only the Get behind it is timed.
            l.abort();
            lists.push(0.0);
        } else {
            lists.push(l.await??);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!(
        "list p50 {:.3} ms; get alone p50 {:.3} ms; get behind the list p50 {:.3} ms, p90 {:.3} ms",
        quantile(&mut lists, 0.5),
        quantile(&mut alone, 0.5),
        quantile(&mut behind, 0.5),
        quantile(&mut behind, 0.9),
    );
    Ok(())
}
