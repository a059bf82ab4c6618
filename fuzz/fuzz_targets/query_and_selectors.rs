//! A request's URL and headers: the query string and every parameter read
//! from it, the request path, label and field selectors, continue tokens and
//! media types. None of them may panic, whatever the bytes.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use watchcache::api::request::negotiation;
use watchcache::api::request::params::Query;
use watchcache::api::request::request_info::RequestInfo;
use watchcache::cacher::continue_token;
use watchcache::object::selector::{FieldSelector, LabelSelector};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // One input drives several parsers: a path before the first '?', the
    // query after it, and the whole text as a selector, token and header.
    let (path, query) = text.split_once('?').unwrap_or((text, ""));
    let q = Query::parse(Some(query));
    let _ = q.resource_version();
    let _ = q.resource_version_match();
    let _ = q.limit();
    let _ = q.timeout();
    let _ = q.dry_run();
    let _ = q.continue_token();
    let _ = q.bool("watch");
    for method in [http::Method::GET, http::Method::POST, http::Method::DELETE] {
        let _ = RequestInfo::new(&method, path, &q);
    }
    if let Ok(sel) = LabelSelector::parse(text) {
        let _ = sel.exact_pairs();
        let _ = sel.matches(&Default::default());
    }
    let paths: [Arc<str>; 1] = [Arc::from("spec.nodeName")];
    if let Ok(sel) = FieldSelector::parse(text, &paths) {
        let _ = sel.exact_pairs();
    }
    let _ = watchcache::object::selector::exact_name(text);
    let _ = continue_token::decode(text, "/registry/pods/");
    let _ = negotiation::wants_table(Some(text));
    let _ = negotiation::wants_protobuf(Some(text));
    let _ = negotiation::media_type(Some(text));
});
