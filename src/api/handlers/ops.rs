//! Operational endpoints: `/healthz`, `/livez` (always `ok` while the process
//! serves), `/readyz` (etcd reachable and every cacher ready; `?verbose`
//! lists each check) and
//! `/metrics` (Prometheus text format).

use hyper::body::Incoming;
use hyper::{Method, Request, Response};

use crate::api::request::params::Query;
use crate::api::response::Body;
use crate::api::response::writers::{full, response, status_response};
use crate::api::state::State;
use crate::api::status::ApiStatus;

pub fn handle(state: &State, req: &Request<Incoming>, query: &Query) -> Response<Body> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return status_response(&ApiStatus::method_not_allowed(format!(
            "{} is not supported on {}",
            req.method(),
            req.uri().path()
        )));
    }
    match req.uri().path() {
        "/healthz" | "/livez" => response(200, "text/plain; charset=utf-8", full("ok")),
        "/readyz" => readyz(state, query),
        "/metrics" => metrics(state),
        path => status_response(&ApiStatus::not_found(format!("{path} not found"))),
    }
}

fn readyz(state: &State, query: &Query) -> Response<Body> {
    let mut ready = true;
    let mut lines = String::from("[+]ping ok\n");
    if state
        .etcd_reachable
        .load(std::sync::atomic::Ordering::Relaxed)
    {
        lines.push_str("[+]etcd ok\n");
    } else {
        ready = false;
        match state.storage.tls_error() {
            Some(e) => lines.push_str(&format!("[-]etcd failed: not reachable: {e}\n")),
            None => lines.push_str("[-]etcd failed: not reachable\n"),
        }
    }
    for r in &state.resources {
        let name = if r.config.group.is_empty() {
            r.config.plural.clone()
        } else {
            format!("{}.{}", r.config.plural, r.config.group)
        };
        if r.cacher.is_ready() {
            lines.push_str(&format!("[+]cacher-{name} ok\n"));
        } else {
            ready = false;
            lines.push_str(&format!("[-]cacher-{name} failed: not ready\n"));
        }
    }
    let code = if ready { 200 } else { 503 };
    let body = if query.has("verbose") {
        lines.push_str(if ready {
            "readyz check passed\n"
        } else {
            "readyz check failed\n"
        });
        lines
    } else if ready {
        "ok".to_string()
    } else {
        // Like Kubernetes: the failing checks even without ?verbose.
        let mut s: String = lines
            .lines()
            .filter(|l| l.starts_with("[-]"))
            .map(|l| format!("{l}\n"))
            .collect();
        s.push_str("readyz check failed\n");
        s
    };
    response(code, "text/plain; charset=utf-8", full(body))
}

fn metrics(state: &State) -> Response<Body> {
    // Gauges that are cheapest to read at scrape time.
    let m = crate::metrics::metrics();
    m.api_open_watches
        .set(i64::try_from(state.open_watches()).unwrap_or(i64::MAX));
    response(
        200,
        "text/plain; version=0.0.4; charset=utf-8",
        full(crate::metrics::gather()),
    )
}
