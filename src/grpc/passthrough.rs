//! The services the front passes to etcd unchanged: Lease, Maintenance and
//! Cluster (so `etcdctl lease grant`, `put --lease`, `endpoint status`,
//! `member list` work against the front), request and answer untouched (a
//! lease revoke's revision is noted for serializable reads, see [`super::kv`]).

use std::sync::Arc;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use etcd_client::proto::*;

use super::Front;
use super::upstream::Upstream;

/// A client's request stream as a plain stream of messages, ending at the
/// client's end or first error.
pub(crate) fn messages<T: Send + 'static>(s: Streaming<T>) -> impl Stream<Item = T> + Send {
    futures::stream::unfold(s, |mut s| async move {
        match s.message().await {
            Ok(Some(m)) => Some((m, s)),
            _ => None,
        }
    })
}

/// A service impl whose unary methods call the same path on etcd, plus
/// the methods written out (`async_trait` must see the expanded methods,
/// so the macro emits the whole impl).
macro_rules! passthrough {
    (
        impl $tr:ident for $ty:ident {
            $($name:ident($req:ty) -> $resp:ty = $path:literal;)*
        }
        $($rest:tt)*
    ) => {
        #[tonic::async_trait]
        impl $tr for $ty {
            $(
                async fn $name(&self, req: Request<$req>) -> Result<Response<$resp>, Status> {
                    self.upstream.unary($path, req).await
                }
            )*
            $($rest)*
        }
    };
}

/// Lease: every call to etcd.
#[derive(Debug, Clone)]
pub struct LeaseService {
    pub(crate) upstream: Upstream,
    /// Told of revokes (they delete the lease's keys); its shutdown ends
    /// open keep-alive streams.
    pub(crate) front: Arc<Front>,
}

passthrough! {
    impl PbLeaseService for LeaseService {
        lease_grant(PbLeaseGrantRequest) -> PbLeaseGrantResponse = "/etcdserverpb.Lease/LeaseGrant";
        lease_time_to_live(PbLeaseTimeToLiveRequest) -> PbLeaseTimeToLiveResponse = "/etcdserverpb.Lease/LeaseTimeToLive";
        lease_leases(PbLeaseLeasesRequest) -> PbLeaseLeasesResponse = "/etcdserverpb.Lease/LeaseLeases";
    }

    async fn lease_revoke(
        &self,
        req: Request<PbLeaseRevokeRequest>,
    ) -> Result<Response<PbLeaseRevokeResponse>, Status> {
        let resp: Response<PbLeaseRevokeResponse> = self
            .upstream
            .unary("/etcdserverpb.Lease/LeaseRevoke", req)
            .await?;
        // The lease's keys are gone at this revision, wherever they were.
        if let Some(h) = &resp.get_ref().header {
            self.front.note_seen(h.revision);
        }
        Ok(resp)
    }

    type LeaseKeepAliveStream = BoxStream<'static, Result<PbLeaseKeepAliveResponse, Status>>;

    async fn lease_keep_alive(
        &self,
        req: Request<Streaming<PbLeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        let md = req.metadata().clone();
        let up = self
            .upstream
            .streaming(
                "/etcdserverpb.Lease/LeaseKeepAlive",
                &md,
                messages(req.into_inner()),
            )
            .await?;
        let shutdown = self.front.shutdown.clone().cancelled_owned();
        Ok(Response::new(up.into_inner().take_until(shutdown).boxed()))
    }
}

/// Maintenance: every call to etcd (Status and Alarm are what clients use).
#[derive(Debug, Clone)]
pub struct MaintenanceService {
    pub(crate) upstream: Upstream,
}

passthrough! {
    impl PbMaintenanceService for MaintenanceService {
        alarm(PbAlarmRequest) -> PbAlarmResponse = "/etcdserverpb.Maintenance/Alarm";
        status(PbStatusRequest) -> PbStatusResponse = "/etcdserverpb.Maintenance/Status";
        defragment(PbDefragmentRequest) -> PbDefragmentResponse = "/etcdserverpb.Maintenance/Defragment";
        hash(PbHashRequest) -> PbHashResponse = "/etcdserverpb.Maintenance/Hash";
        hash_kv(PbHashKvRequest) -> PbHashKvResponse = "/etcdserverpb.Maintenance/HashKV";
        move_leader(PbMoveLeaderRequest) -> PbMoveLeaderResponse = "/etcdserverpb.Maintenance/MoveLeader";
        downgrade(PbDowngradeRequest) -> PbDowngradeResponse = "/etcdserverpb.Maintenance/Downgrade";
    }

    type SnapshotStream = BoxStream<'static, Result<PbSnapshotResponse, Status>>;

    async fn snapshot(
        &self,
        req: Request<PbSnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        let up = self
            .upstream
            .server_streaming("/etcdserverpb.Maintenance/Snapshot", req)
            .await?;
        Ok(Response::new(up.into_inner().boxed()))
    }
}

/// Cluster: every call to etcd.
#[derive(Debug, Clone)]
pub struct ClusterService {
    pub(crate) upstream: Upstream,
}

passthrough! {
    impl PbClusterService for ClusterService {
        member_add(PbMemberAddRequest) -> PbMemberAddResponse = "/etcdserverpb.Cluster/MemberAdd";
        member_remove(PbMemberRemoveRequest) -> PbMemberRemoveResponse = "/etcdserverpb.Cluster/MemberRemove";
        member_update(PbMemberUpdateRequest) -> PbMemberUpdateResponse = "/etcdserverpb.Cluster/MemberUpdate";
        member_list(PbMemberListRequest) -> PbMemberListResponse = "/etcdserverpb.Cluster/MemberList";
        member_promote(PbMemberPromoteRequest) -> PbMemberPromoteResponse = "/etcdserverpb.Cluster/MemberPromote";
    }
}
