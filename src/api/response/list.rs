//! The frames of a List body: [`Frames`], shared by JSON and protobuf
//! Lists, and a JSON List's items ([`JsonListFrames`]), written from the
//! cached wire bytes.

use std::collections::VecDeque;
use std::ops::ControlFlow;

use bytes::{BufMut, Bytes, BytesMut};

use crate::cacher::ListCursor;

/// Frames of a List body are at most about this large (small objects are
/// coalesced; large ones are written as their own frame without copying).
/// Each frame is one socket write and one wake-up of the reader: 256 KiB
/// took a 10,000-object List from about 8 to 7 ms against 64 KiB
/// (docs/BENCHMARKS.md#list-l1), and a response never holds more.
pub const LIST_FRAME_BYTES: usize = 256 * 1024;

/// List body frames in the making, for JSON and protobuf Lists alike:
/// small pieces are copied into a frame of about [`LIST_FRAME_BYTES`]; a
/// large item ends that frame and goes out as a frame of its own, uncopied.
#[derive(Default)]
pub struct Frames {
    buf: BytesMut,
    /// Finished frames not yet handed out.
    ready: VecDeque<Bytes>,
}

impl Frames {
    /// Whether the frame being filled should end before the next item.
    pub fn full(&self) -> bool {
        self.buf.len() >= LIST_FRAME_BYTES || !self.ready.is_empty()
    }

    /// The frame being filled, to append small pieces to.
    pub fn buf(&mut self) -> &mut BytesMut {
        if self.buf.capacity() == 0 {
            self.buf.reserve(LIST_FRAME_BYTES);
        }
        &mut self.buf
    }

    /// An item's bytes: copied, or (large) a frame of their own.
    pub fn put_item(&mut self, item: &Bytes) {
        if item.len() >= LIST_FRAME_BYTES / 4 {
            self.end_frame();
            self.ready.push_back(item.clone());
        } else {
            self.buf().put_slice(item);
        }
    }

    /// Ends the frame being filled (if it has anything).
    pub fn end_frame(&mut self) {
        if !self.buf.is_empty() {
            self.ready.push_back(std::mem::take(&mut self.buf).freeze());
        }
    }

    /// The next finished frame.
    pub fn pop(&mut self) -> Option<Bytes> {
        self.ready.pop_front()
    }
}

/// The frames of a JSON List body after its head: the items' cached wire bytes
/// ([`Frames`]), then `]}`. The items are walked a frame at a time, as
/// hyper asks for the next frame.
pub struct JsonListFrames {
    items: ListCursor,
    first: bool,
    done: bool,
    frames: Frames,
}

impl JsonListFrames {
    pub fn new(items: ListCursor) -> JsonListFrames {
        JsonListFrames {
            items,
            first: true,
            done: false,
            frames: Frames::default(),
        }
    }
}

impl Iterator for JsonListFrames {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        loop {
            if let Some(f) = self.frames.pop() {
                return Some(f);
            }
            if self.done {
                return None;
            }
            let (first, frames) = (&mut self.first, &mut self.frames);
            let more = self.items.visit(|obj| {
                if frames.full() {
                    return ControlFlow::Break(());
                }
                if !*first {
                    frames.buf().put_u8(b',');
                }
                *first = false;
                frames.put_item(&obj.wire);
                ControlFlow::Continue(())
            });
            if !more {
                self.frames.buf().put_slice(b"]}");
                self.done = true;
            }
            self.frames.end_frame();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;

    use super::{JsonListFrames, LIST_FRAME_BYTES};
    use crate::api::response::budget::ListBodyBudget;
    use crate::api::response::list_body_cache::{ListBodyCache, ListMedia, Lookup, list_frames};
    use crate::cacher::{ListItems, Snapshot};
    use crate::object::Object;

    fn obj(i: usize, blob: usize) -> Arc<Object> {
        let name = format!("o{i:05}");
        let wire = format!(r#"{{"name":"{name}","blob":"{}"}}"#, "x".repeat(blob));
        Arc::new(crate::object::tests::object("ns", &name, wire))
    }

    /// The frames of a List of objects with these blob sizes, and the names
    /// the joined body lists.
    fn frames(sizes: &[usize]) -> (Vec<Bytes>, Vec<String>) {
        let items: Vec<Arc<Object>> = sizes.iter().enumerate().map(|(i, n)| obj(i, *n)).collect();
        // Recorded as a List of everything would be: what is kept is
        // exactly what was sent after the head.
        let cache = ListBodyCache::new("reads-test", ListBodyBudget::new(64 << 20));
        let snap = Arc::new(Snapshot::empty(1, 0));
        let recorder = cache.second_list(&snap, "/r/pods/ns/", ListMedia::Json);
        let head = Bytes::from_static(br#"{"kind":"PodList","items":["#);
        let frames: Vec<Bytes> = list_frames(
            head.clone(),
            JsonListFrames::new(ListItems::Collected(items).into_cursor()),
            Some(recorder),
        )
        .collect();
        assert_eq!(frames[0], head, "the head is a frame of its own");
        let Lookup::Hit(kept) = cache.lookup(&snap, "/r/pods/ns/", ListMedia::Json) else {
            panic!("a finished body is kept");
        };
        assert_eq!(frames[1..].concat(), kept.concat());
        let body: Vec<u8> = frames.concat();
        let v: serde_json::Value = serde_json::from_slice(&body).expect("the body is JSON");
        let names = v["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|o| o["name"].as_str().unwrap_or("").to_string())
            .collect();
        (frames, names)
    }

    #[test]
    fn list_frames_coalesce_small_items_and_send_large_ones_uncopied() {
        let large = LIST_FRAME_BYTES / 2;
        let many_small = vec![1000; 3 * LIST_FRAME_BYTES / 1000];
        for sizes in [
            vec![],
            vec![10],
            many_small.clone(),
            vec![10, large, 10],
            vec![large],
            vec![10, large],
            vec![large, large],
            [many_small.as_slice(), &[large], many_small.as_slice()].concat(),
        ] {
            let (frames, names) = frames(&sizes);
            let want: Vec<String> = (0..sizes.len()).map(|i| format!("o{i:05}")).collect();
            assert_eq!(names, want, "sizes {sizes:?}");
            // Every frame is bounded (one item of overshoot at most), and each
            // large item is a frame of its own.
            for f in &frames {
                assert!(f.len() < LIST_FRAME_BYTES + 2000 || f.starts_with(b"{\"name\""));
            }
            let alone = frames
                .iter()
                .filter(|f| {
                    f.len() > large
                        && f.starts_with(b"{\"name\"")
                        && f.ends_with(b"\"}")
                        && !f.windows(3).any(|w| w == b"},{")
                })
                .count();
            assert_eq!(
                alone,
                sizes.iter().filter(|n| **n == large).count(),
                "sizes {sizes:?}"
            );
        }
        // Small items are coalesced: 3 frames' worth take about 3 frames
        // (after the head's).
        let (f, _) = frames(&many_small);
        assert!((4..=5).contains(&f.len()), "{} frames", f.len());
    }
}
