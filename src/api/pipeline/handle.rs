//! Every request's way through the server: its [`RequestInfo`] resolved
//! once, admitted ([`super::admit`]: authentication, authorization, audit),
//! routed ([`super::route`]), gzipped when the client asks, then counted
//! in the HTTP metrics under its verb and logged.

use std::sync::Arc;
use std::time::Instant;

use hyper::body::Incoming;
use hyper::{Request, Response};
use tracing::{Instrument, debug};

use super::admit;
use super::route::route;
use crate::api::handlers::get;
use crate::api::request::RequestInfo;
use crate::api::request::connection::ConnectionHandle;
use crate::api::request::params::Query;
use crate::api::response::writers::status_response;
use crate::api::response::{Body, compression};
use crate::api::state::State;
use crate::api::status::ApiStatus;

/// Resolves the request's [`RequestInfo`] once, authenticates and
/// authorizes it ([`admit`]), routes by it, logs the request and records
/// the HTTP metrics under its verb.
pub(crate) async fn handle(
    state: Arc<State>,
    conn: ConnectionHandle,
    req: Request<Incoming>,
) -> Response<Body> {
    let start = Instant::now();
    let method = req.method().clone();
    let query = Query::parse(req.uri().query());
    let info = RequestInfo::new(&method, req.uri().path(), &query);
    let verb = match &info {
        Ok(info) => info.metric_verb(),
        Err(e) => e.metric_verb(),
    };
    // The span records the path when it is created (when debug logging is
    // on): no copy of it is kept for the log line.
    let span = tracing::debug_span!("request", %method, path = %req.uri().path(), verb);
    let gzip = state.config.server.response_compression && compression::accepts_gzip(req.headers());
    let resp = match &info {
        Ok(info) => match admit::admit(&state, &req, conn.identity(), info) {
            Ok(admitted) => {
                // Each level below is boxed: an async fn holds its callee's
                // future and the arguments it moved there, so unboxed the
                // request future was 17 KB (measured with `size_of_val`),
                // allocated and moved for every request; now 1.7 KB.
                let user = admitted.user.as_ref();
                // A Get the cache answers at once needs none of the routed
                // futures below (nor their boxes).
                let resp = match span.in_scope(|| get::now(&state, &req, info, &query)) {
                    Some(Ok(resp)) => resp,
                    Some(Err(status)) => status_response(&status),
                    None => {
                        Box::pin(
                            route(state, req, info, query, user, &conn).instrument(span.clone()),
                        )
                        .await
                    }
                };
                admit::finish(&admitted, resp.status().as_u16());
                resp
            }
            Err(denied) => status_response(&unread_body(&req, denied)),
        },
        Err(e) => status_response(&unread_body(&req, e.status())),
    };
    let resp = if gzip && compression::candidate(&resp) {
        // Boxed, see above: only a response that may be gzipped pays for it.
        Box::pin(compression::compress(resp).instrument(span.clone())).await
    } else {
        resp
    };
    let elapsed = start.elapsed();
    let code = resp.status().as_u16();
    crate::metrics::observe_http_request(verb, resp.status(), elapsed);
    let _enter = span.enter();
    debug!(
        %method,
        path = info.as_ref().map(|i| i.path()).unwrap_or_default(),
        verb,
        code,
        duration_ms = elapsed.as_secs_f64() * 1000.0,
        "request"
    );
    resp
}

/// `status` for a request refused before its body was read: on HTTP/1.x,
/// with `Connection: close` when a body may still be on its way (see
/// [`ApiStatus::close_connection`]).
fn unread_body(req: &Request<Incoming>, status: ApiStatus) -> ApiStatus {
    use hyper::body::Body as _;
    if req.version() < hyper::Version::HTTP_2 && !req.body().is_end_stream() {
        status.with_close_connection()
    } else {
        status
    }
}
