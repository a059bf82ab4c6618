//! A connection's HTTP/2 streams run inside the connection's own task.
//!
//! Why: hyper hands every HTTP/2 stream (request handler, then response
//! body pump) to its executor, and with tokio's that is a task per stream.
//! A watch event for 100 watches on one connection then woke 100 tasks,
//! scheduled them on either worker, and each took the connection's h2 lock
//! from whichever core it ran on, before the connection's task woke once
//! more to write what they queued: tokio's scheduler and the cross-core
//! wake-ups were a third of a fan-out profile. Here [`StreamExecutor`]
//! queues each stream as a future of the connection ([`Streams`]), which
//! polls only the streams that were woken (a `FuturesUnordered`), then the
//! connection, in one task on one core: the frames an event's watchers
//! queued are written in the same poll.
//!
//! The task is woken once per round, not once per watcher: what wakes it
//! while it polls (the next watcher of the event, h2 waking the connection
//! for the frames just queued, the set of streams yielding every few
//! streams) is noted by its [`TaskWaker`] and served by another round of
//! the same poll. Without that, the task was polled about 50 times per
//! event at 100 watches per connection, chasing the event's wake loop.
//!
//! A stream that panics ends alone (its request's response is cut short,
//! as a panicking tokio task would), never its connection's other streams.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::task::AtomicWaker;
use parking_lot::Mutex;

type StreamFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Rounds (streams, then the connection) in one poll of the task before it
/// yields to the scheduler, so one busy connection cannot starve others.
const MAX_ROUNDS: usize = 16;

/// hyper's executor for one connection: queues its streams for [`Streams`].
#[derive(Clone, Default)]
pub(crate) struct StreamExecutor {
    spawned: Arc<Mutex<Vec<StreamFuture>>>,
}

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, fut: F) {
        let fut = AssertUnwindSafe(fut).catch_unwind().map(|r| {
            if r.is_err() {
                tracing::error!("an HTTP/2 stream's task panicked; the stream is ended");
            }
        });
        self.spawned.lock().push(Box::pin(fut));
    }
}

/// A connection future (`conn`) driven together with the streams its
/// [`StreamExecutor`] was given: resolves with the connection, dropping
/// whatever streams are left (they cannot send anything once it is gone).
pub(crate) struct Streams<C> {
    conn: Pin<Box<C>>,
    streams: FuturesUnordered<StreamFuture>,
    spawned: Arc<Mutex<Vec<StreamFuture>>>,
    /// What the streams and the connection are given to wake this task.
    task: Arc<TaskWaker>,
    waker: Waker,
}

impl<C: Future> Streams<C> {
    pub(crate) fn new(conn: C, executor: &StreamExecutor) -> Streams<C> {
        let task = TaskWaker::new();
        Streams {
            conn: Box::pin(conn),
            streams: FuturesUnordered::new(),
            spawned: Arc::clone(&executor.spawned),
            waker: task.waker(),
            task,
        }
    }

    /// The connection, e.g. for a graceful shutdown.
    pub(crate) fn conn(&mut self) -> Pin<&mut C> {
        self.conn.as_mut()
    }

    /// Streams open now (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.streams.len() + self.spawned.lock().len()
    }
}

impl<C: Future> Future for Streams<C> {
    type Output = C::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        let this = self.get_mut();
        let task_cx = cx;
        let cx = &mut Context::from_waker(&this.waker);
        let mut rounds = 0;
        loop {
            this.task.begin_poll(task_cx.waker());
            // The streams first: what they queue is written by the
            // connection's poll right after, in the same wake.
            while let Poll::Ready(Some(())) = this.streams.poll_next_unpin(cx) {}
            if let Poll::Ready(out) = this.conn.as_mut().poll(cx) {
                this.task.end_poll();
                return Poll::Ready(out);
            }
            // Streams the connection accepted in that poll start now.
            let started = {
                let mut spawned = this.spawned.lock();
                let started = !spawned.is_empty();
                for s in spawned.drain(..) {
                    this.streams.push(s);
                }
                started
            };
            // Woken meanwhile: h2 wakes the connection for the frames the
            // streams queued, the set of streams yields every few streams,
            // another thread's event. Another round here costs less than a
            // trip through the scheduler; a bounded number of them.
            let woken = this.task.end_poll();
            if !started && !woken {
                return Poll::Pending;
            }
            rounds += 1;
            if rounds >= MAX_ROUNDS {
                task_cx.waker().wake_by_ref();
                return Poll::Pending;
            }
        }
    }
}

/// The waker [`Streams`] hands to what it polls: a wake while the task
/// polls is noted for it ([`TaskWaker::end_poll`]) instead of rescheduling
/// it; any other wake reaches the task's own waker.
#[derive(Default)]
struct TaskWaker {
    task: AtomicWaker,
    /// [`IDLE`], [`POLLING`] or [`WOKEN`] (woken while polling).
    state: AtomicU8,
}

const IDLE: u8 = 0;
const POLLING: u8 = 1;
const WOKEN: u8 = 2;

impl TaskWaker {
    fn new() -> Arc<TaskWaker> {
        Arc::default()
    }

    /// The task is being polled, by `waker`'s task.
    fn begin_poll(&self, waker: &Waker) {
        self.task.register(waker);
        self.state.store(POLLING, Ordering::Release);
    }

    /// The poll is over; `true` if the task was woken meanwhile (it must
    /// poll again, or wake itself). A wake from now on reschedules it.
    fn end_poll(&self) -> bool {
        self.state.swap(IDLE, Ordering::AcqRel) == WOKEN
    }

    fn waker(self: &Arc<Self>) -> Waker {
        Waker::from(Arc::clone(self))
    }
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        match self
            .state
            .compare_exchange(POLLING, WOKEN, Ordering::AcqRel, Ordering::Acquire)
        {
            // Noted: the task polls again before it returns.
            Ok(_) | Err(WOKEN) => {}
            Err(_) => self.task.wake(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Executor;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Streams given to the executor while the connection runs are polled
    /// by the connection's future, to completion, woken by their own wakers.
    #[tokio::test]
    async fn streams_run_inside_the_connection_future() {
        let exec = StreamExecutor::default();
        let done = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (end_tx, end_rx) = tokio::sync::oneshot::channel::<()>();
        let conn = {
            let exec = exec.clone();
            let done = Arc::clone(&done);
            async move {
                // Like hyper: streams are spawned from inside the connection.
                let d = Arc::clone(&done);
                exec.execute(async move {
                    d.fetch_add(1, Ordering::SeqCst);
                });
                let d = Arc::clone(&done);
                exec.execute(async move {
                    let _ = rx.await;
                    d.fetch_add(1, Ordering::SeqCst);
                });
                let _ = end_rx.await;
                "closed"
            }
        };
        let mut driven = Streams::new(conn, &exec);
        let woken = Arc::new(Woken::default());
        let waker = futures::task::waker(Arc::clone(&woken));
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut driven).poll(&mut cx).is_pending());
        assert_eq!(done.load(Ordering::SeqCst), 1, "the ready stream ran");
        assert_eq!(driven.len(), 1);
        let before = woken.0.load(Ordering::SeqCst);
        tx.send(()).unwrap();
        assert!(
            woken.0.load(Ordering::SeqCst) > before,
            "a stream's wake wakes the connection's task"
        );
        assert!(Pin::new(&mut driven).poll(&mut cx).is_pending());
        assert_eq!(done.load(Ordering::SeqCst), 2, "the woken stream ran");
        assert_eq!(driven.len(), 0);
        end_tx.send(()).unwrap();
        assert_eq!(
            Pin::new(&mut driven).poll(&mut cx),
            Poll::Ready("closed"),
            "resolves with the connection"
        );
    }

    #[derive(Default)]
    struct Woken(AtomicUsize);

    impl Woken {
        fn count(&self) -> usize {
            self.0.load(Ordering::SeqCst)
        }
    }

    /// A wake while the task polls is noted, not sent to the task (from
    /// this thread or another); after the poll, wakes reach the task.
    #[test]
    fn wakes_while_the_task_polls_are_noted_for_it() {
        let woken = Arc::new(Woken::default());
        let task = futures::task::waker(Arc::clone(&woken));
        let tw = TaskWaker::new();
        tw.begin_poll(&task);
        assert!(!tw.end_poll(), "not woken");
        tw.begin_poll(&task);
        tw.waker().wake_by_ref();
        let w = tw.waker();
        std::thread::spawn(move || w.wake()).join().unwrap();
        assert_eq!(woken.count(), 0, "not rescheduled");
        assert!(tw.end_poll(), "noted");
        tw.waker().wake_by_ref();
        assert_eq!(woken.count(), 1, "after the poll: the task is woken");
        tw.begin_poll(&task);
        assert!(!tw.end_poll());
    }

    impl futures::task::ArcWake for Woken {
        fn wake_by_ref(arc_self: &Arc<Self>) {
            arc_self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A stream that wakes itself (as h2's streams and the set of streams
    /// do) is polled again within the same poll of the connection's task,
    /// without a trip through the scheduler.
    #[test]
    fn a_wake_during_the_poll_is_served_by_another_round() {
        let exec = StreamExecutor::default();
        let done = Arc::new(AtomicUsize::new(0));
        let d = Arc::clone(&done);
        exec.execute(async move {
            let mut first = true;
            std::future::poll_fn(|cx| {
                if std::mem::take(&mut first) {
                    cx.waker().wake_by_ref();
                    Poll::Pending
                } else {
                    Poll::Ready(())
                }
            })
            .await;
            d.fetch_add(1, Ordering::SeqCst);
        });
        let mut driven = Streams::new(std::future::pending::<()>(), &exec);
        let woken = Arc::new(Woken::default());
        let waker = futures::task::waker(Arc::clone(&woken));
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut driven).poll(&mut cx).is_pending());
        assert_eq!(done.load(Ordering::SeqCst), 1, "done in one poll");
        assert_eq!(woken.count(), 0, "the task was not rescheduled");
    }

    /// A panicking stream ends alone; the connection and its other streams
    /// go on.
    #[tokio::test]
    async fn a_panicking_stream_ends_alone() {
        let exec = StreamExecutor::default();
        let done = Arc::new(AtomicUsize::new(0));
        let (end_tx, end_rx) = tokio::sync::oneshot::channel::<()>();
        let conn = {
            let exec = exec.clone();
            let done = Arc::clone(&done);
            async move {
                exec.execute(async {
                    panic!("a bug in a handler");
                });
                tokio::task::yield_now().await;
                let d = Arc::clone(&done);
                exec.execute(async move {
                    d.fetch_add(1, Ordering::SeqCst);
                });
                let _ = end_rx.await;
            }
        };
        let driven = Streams::new(conn, &exec);
        let handle = tokio::spawn(driven);
        tokio::task::yield_now().await;
        for _ in 0..100 {
            if done.load(Ordering::SeqCst) == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(done.load(Ordering::SeqCst), 1, "the other stream ran");
        end_tx.send(()).unwrap();
        handle.await.expect("the connection did not panic");
    }
}
