//! `Upstream`: etcd's v3 API spoken unchanged over the store's tonic channel
//! (same endpoints, same TLS), with the prost codec: what the front does
//! not serve from its cache goes to etcd as it came, and etcd's answer goes
//! back as it is.

use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes};
use futures::Stream;
use tokio::sync::Notify;
use tonic::client::Grpc;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};
use tonic_prost::ProstCodec;

use crate::storage::MAX_DECODING_MESSAGE_BYTES;

/// Request metadata passed on to etcd: its auth token. (Transport headers
/// such as `content-type` or `te` belong to each hop.)
const FORWARDED_METADATA: &[&str] = &["token", "authorization"];

/// A raw gRPC client of etcd. Cheap to clone.
#[derive(Clone)]
pub struct Upstream {
    grpc: Grpc<Channel>,
    /// Told of every auth error etcd answers (see [`is_auth_error`]): the
    /// front's view of etcd's auth status may be stale.
    auth_errors: Arc<Notify>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream").finish_non_exhaustive()
    }
}

impl Upstream {
    pub fn new(channel: Channel) -> Upstream {
        Upstream {
            grpc: Grpc::new(channel)
                .max_decoding_message_size(MAX_DECODING_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_DECODING_MESSAGE_BYTES),
            auth_errors: Arc::new(Notify::new()),
        }
    }

    /// Woken when etcd answered a call with an auth error.
    pub(crate) fn auth_errors(&self) -> &Arc<Notify> {
        &self.auth_errors
    }

    fn seen<T>(&self, r: Result<T, Status>) -> Result<T, Status> {
        if let Err(s) = &r
            && is_auth_error(s)
        {
            self.auth_errors.notify_one();
        }
        r
    }

    async fn ready(&self) -> Result<Grpc<Channel>, Status> {
        let mut g = self.grpc.clone();
        g.ready()
            .await
            .map_err(|e| Status::unavailable(format!("etcd: {e}")))?;
        Ok(g)
    }

    /// One unary call, e.g. `/etcdserverpb.KV/Put`.
    pub async fn unary<Req, Resp>(
        &self,
        path: &'static str,
        req: Request<Req>,
    ) -> Result<Response<Resp>, Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let mut g = self.ready().await?;
        let r = g
            .unary(
                forward(req),
                PathAndQuery::from_static(path),
                ProstCodec::default(),
            )
            .await;
        self.seen(r)
    }

    /// One unary call whose messages pass as they are, undecoded: for
    /// services the front relays without reading (Auth).
    pub async fn unary_raw(
        &self,
        path: &'static str,
        req: Request<Bytes>,
    ) -> Result<Response<Bytes>, Status> {
        let mut g = self.ready().await?;
        let r = g
            .unary(forward(req), PathAndQuery::from_static(path), RawCodec)
            .await;
        self.seen(r)
    }

    /// A call with a server stream, e.g. `/etcdserverpb.Maintenance/Snapshot`.
    pub async fn server_streaming<Req, Resp>(
        &self,
        path: &'static str,
        req: Request<Req>,
    ) -> Result<Response<Streaming<Resp>>, Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let mut g = self.ready().await?;
        let r = g
            .server_streaming(
                forward(req),
                PathAndQuery::from_static(path),
                ProstCodec::default(),
            )
            .await;
        self.seen(r)
    }

    /// A bidirectional stream, e.g. `/etcdserverpb.Watch/Watch`; `md` is the
    /// client's request metadata.
    pub async fn streaming<Req, Resp, S>(
        &self,
        path: &'static str,
        md: &tonic::metadata::MetadataMap,
        requests: S,
    ) -> Result<Response<Streaming<Resp>>, Status>
    where
        S: Stream<Item = Req> + Send + 'static,
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let mut g = self.ready().await?;
        let mut req = Request::new(requests);
        copy_metadata(md, req.metadata_mut());
        let r = g
            .streaming(req, PathAndQuery::from_static(path), ProstCodec::default())
            .await;
        self.seen(r)
    }
}

/// The same message with only the metadata etcd should see.
fn forward<T>(req: Request<T>) -> Request<T> {
    let (md, ext, msg) = req.into_parts();
    let mut out = Request::new(msg);
    copy_metadata(&md, out.metadata_mut());
    let _ = ext;
    out
}

fn copy_metadata(from: &tonic::metadata::MetadataMap, to: &mut tonic::metadata::MetadataMap) {
    for key in FORWARDED_METADATA {
        if let Some(v) = from.get(*key) {
            to.insert(*key, v.clone());
        }
    }
}

/// Whether etcd refused a call for its auth: a bad or missing token, or a
/// user without the permission (etcd's `ErrGRPCUserEmpty`,
/// `ErrGRPCInvalidAuthToken`, `ErrGRPCPermissionDenied`, ...).
pub(crate) fn is_auth_error(s: &Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
    ) || s.message().starts_with("etcdserver: user name")
        || s.message().contains("auth")
}

/// A message as its encoded bytes, unchanged both ways: the front relays
/// it without decoding it (not a protobuf codec: nothing is parsed).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}
