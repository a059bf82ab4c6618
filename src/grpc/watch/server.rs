//! The Watch service as tonic serves it, with small per-stream codec
//! buffers: etcd-client's generated `WatchServer` does not let one set them,
//! and its defaults were most of a busy watcher's memory.

use std::sync::Arc;

use tonic::{Request, Response, Status, Streaming};

use etcd_client::proto::*;

use super::WatchService;

/// Codec buffer per stream and direction. tonic allocates its default
/// (8 KiB) eagerly for the request and the response side of every stream,
/// which was most of a busy watcher's memory (16 KiB of the front's
/// 16 KiB per watcher against grpc-proxy's 10); watch requests and most
/// responses are small, and the buffers grow for large ones.
const STREAM_BUFFER: usize = 1024;
/// tonic's default: encode this much before yielding.
const YIELD_THRESHOLD: usize = 32 * 1024;

/// etcd's Watch service ([`WatchService`]) with small per-stream codec
/// buffers: what etcd-client's generated `WatchServer` does, bar the
/// buffer sizes it does not let one set.
#[derive(Clone)]
pub struct WatchServer {
    inner: Arc<WatchService>,
    max_encoding_message_size: usize,
}

impl WatchServer {
    pub fn new(inner: WatchService, max_encoding_message_size: usize) -> Self {
        WatchServer {
            inner: Arc::new(inner),
            max_encoding_message_size,
        }
    }
}

impl tonic::server::NamedService for WatchServer {
    const NAME: &'static str = "etcdserverpb.Watch";
}

/// Prost encoding with [`STREAM_BUFFER`]-sized buffers.
struct LeanCodec;

impl tonic::codec::Codec for LeanCodec {
    type Encode = PbWatchResponse;
    type Decode = PbWatchRequest;
    type Encoder = tonic_prost::ProstEncoder<PbWatchResponse>;
    type Decoder = tonic_prost::ProstDecoder<PbWatchRequest>;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::new(tonic::codec::BufferSettings::new(
            STREAM_BUFFER,
            YIELD_THRESHOLD,
        ))
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::new(tonic::codec::BufferSettings::new(
            STREAM_BUFFER,
            YIELD_THRESHOLD,
        ))
    }
}

/// The `Watch` method as tonic's streaming service.
struct WatchMethod(Arc<WatchService>);

impl tonic::server::StreamingService<PbWatchRequest> for WatchMethod {
    type Response = PbWatchResponse;
    type ResponseStream = <WatchService as PbWatchService>::WatchStream;
    type Future = tonic::codegen::BoxFuture<Response<Self::ResponseStream>, Status>;

    fn call(&mut self, req: Request<Streaming<PbWatchRequest>>) -> Self::Future {
        let inner = Arc::clone(&self.0);
        Box::pin(async move { <WatchService as PbWatchService>::watch(&inner, req).await })
    }
}

impl<B> tower::Service<tonic::codegen::http::Request<B>> for WatchServer
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = tonic::codegen::http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = tonic::codegen::BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: tonic::codegen::http::Request<B>) -> Self::Future {
        let method = (req.uri().path() == "/etcdserverpb.Watch/Watch")
            .then(|| WatchMethod(Arc::clone(&self.inner)));
        let max = self.max_encoding_message_size;
        Box::pin(async move {
            Ok(match method {
                Some(method) => {
                    let mut grpc = tonic::server::Grpc::new(LeanCodec)
                        .apply_max_message_size_config(None, Some(max));
                    grpc.streaming(method, req).await
                }
                None => Status::unimplemented("").into_http(),
            })
        })
    }
}
