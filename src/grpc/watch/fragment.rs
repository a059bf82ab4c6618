//! Fragmented responses, as clientv3 assembles them: the ring's responses
//! split as etcd's `sendFragments` splits them, and etcd's fragments of a
//! forwarded watch kept back to back (nothing else queued between them).

use prost::Message;

use etcd_client::proto::*;

use super::state::ClientStream;

/// etcd's default `--max-request-bytes`: `push_events` splits responses
/// above it.
const MAX_REQUEST_BYTES: usize = 1536 * 1024;

impl ClientStream {
    /// Queues one event response, split as etcd's `sendFragments` does when
    /// the watch asked for fragments and the response is too large.
    pub(super) fn push_events(&mut self, resp: PbWatchResponse, fragment: bool) {
        self.note_sent(&resp.events);
        if !fragment || resp.events.len() < 2 || resp.encoded_len() < MAX_REQUEST_BYTES {
            self.pending.push_back(resp);
            return;
        }
        let mut rest = resp.events.into_iter().peekable();
        let base = PbWatchResponse {
            events: Vec::new(),
            ..resp
        };
        while rest.peek().is_some() {
            let mut cur = PbWatchResponse {
                fragment: true,
                ..base.clone()
            };
            while let Some(ev) = rest.peek() {
                cur.events.push(ev.clone());
                if cur.events.len() > 1 && cur.encoded_len() >= MAX_REQUEST_BYTES {
                    cur.events.pop();
                    break;
                }
                rest.next();
            }
            if rest.peek().is_none() {
                cur.fragment = false;
            }
            self.pending.push_back(cur);
        }
    }

    /// Follows etcd's fragments of a forwarded watch about to be queued:
    /// `open_fragment` holds everything else back until the last one.
    pub(super) fn track_fragment(&mut self, resp: &PbWatchResponse) {
        if resp.fragment {
            self.open_fragment = Some(resp.watch_id);
        } else if self.open_fragment == Some(resp.watch_id) {
            self.open_fragment = None; // its last fragment
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::ReceiverStream;
    use tonic::Status;

    use super::*;
    use crate::grpc::watch::test_support::*;

    /// Fragment `n` of etcd's response for watch 5 at revision 20.
    fn fragment(n: usize, last: bool) -> PbWatchResponse {
        PbWatchResponse {
            fragment: !last,
            ..event_answer(5, &format!("/x/{n}"), 20)
        }
    }

    /// Lets the spawned stream take all it will (the clock is paused).
    async fn settle() {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    async fn next_out(
        out: &mut mpsc::Receiver<Result<PbWatchResponse, Status>>,
    ) -> PbWatchResponse {
        tokio::time::timeout(Duration::from_secs(3600), out.recv())
            .await
            .expect("an answer")
            .expect("stream open")
            .expect("ok")
    }

    /// clientv3 drops a response for another watch (or its partial
    /// fragments, on a `canceled`) while assembling a fragmented one: a
    /// cached event and a `canceled` that become due between etcd's
    /// fragments wait for the last one.
    #[tokio::test(start_paused = true)]
    async fn a_fragmented_upstream_response_reaches_the_client_whole() {
        let mut h = harness(8, Duration::from_secs(1_000_000)).await;
        for (id, key) in [(1, "/c/a"), (3, "/c/z")] {
            let w = h.stream.place(id, spec(key, 11)).expect("cached watch");
            h.stream.watches.push(w);
        }
        h.stream.forwarded.insert(5, fwd(None));
        let (client, requests) = mpsc::channel(8);
        tokio::spawn(h.stream.run(ReceiverStream::new(requests).map(Ok)));
        h.from_etcd
            .send(Ok(fragment(0, false)))
            .await
            .expect("runs");
        settle().await;
        h.cache.apply(vec![put("/c/a", b"1".to_vec(), 11)], 11);
        settle().await;
        client.send(cancel(3)).await.expect("runs");
        settle().await;
        h.from_etcd
            .send(Ok(fragment(1, false)))
            .await
            .expect("runs");
        settle().await;
        h.from_etcd.send(Ok(fragment(2, true))).await.expect("runs");
        let mut got = Vec::new();
        for _ in 0..5 {
            let r = next_out(&mut h.out).await;
            got.push((r.watch_id, r.fragment, r.canceled, r.events.len()));
        }
        assert_eq!(
            got[..3],
            [
                (5, true, false, 1),
                (5, true, false, 1),
                (5, false, false, 1)
            ],
            "the fragments back to back: {got:?}"
        );
        got[3..].sort();
        assert_eq!(got[3..], [(1, false, false, 1), (3, false, true, 0)]);
    }

    /// A fragmented response etcd never finishes holds nothing back forever:
    /// the client gets an error (and resumes its watches).
    #[tokio::test(start_paused = true)]
    async fn etcds_stream_ending_mid_fragment_ends_the_client_stream() {
        let Harness {
            mut stream,
            cache,
            mut out,
            to_etcd: _to_etcd,
            from_etcd,
        } = harness(8, Duration::from_secs(1_000_000)).await;
        let w = stream.place(1, spec("/c/a", 11)).expect("cached watch");
        stream.watches.push(w);
        stream.forwarded.insert(5, fwd(None));
        let (_client, requests) = mpsc::channel::<PbWatchRequest>(1);
        tokio::spawn(stream.run(ReceiverStream::new(requests).map(Ok)));
        from_etcd.send(Ok(fragment(0, false))).await.expect("runs");
        settle().await;
        drop(from_etcd);
        cache.apply(vec![put("/c/a", b"1".to_vec(), 11)], 11);
        assert!(next_out(&mut out).await.fragment);
        let end = tokio::time::timeout(Duration::from_secs(3600), out.recv())
            .await
            .expect("not held forever")
            .expect("stream open");
        assert!(end.is_err(), "an error, not the cached event: {end:?}");
    }
}
