//! Wake-ups of one task per connection, deferred to the end of a fan-out.
//!
//! Why: an applied event wakes every watcher of its route, one after the
//! other. The watchers of one connection run in that connection's task
//! (`api::stream_executor`), so each of those wakes is a wake of the same
//! task: the other worker picked it up at the first one and then chased the
//! loop, polling the connection (and writing to its socket) once or twice
//! per watcher instead of once per event, about 50 polls per connection
//! for each event at 100 watches per connection. Inside [`batch`] the wakes
//! of a [`TaskWaker`] are recorded once and fired when the batch ends, so a
//! connection's task runs once, with all its woken watchers ready.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::task::{Wake, Waker};

use futures::task::AtomicWaker;

thread_local! {
    /// The wakes deferred by the batch running on this thread, if any.
    static BATCH: RefCell<Option<Vec<Arc<TaskWaker>>>> = const { RefCell::new(None) };
}

/// Runs `f`, deferring the wakes of every [`TaskWaker`] it makes on this
/// thread to its end (each fired once). A batch inside a batch is part of
/// the outer one.
pub fn batch<R>(f: impl FnOnce() -> R) -> R {
    let outermost = BATCH.with(|b| {
        let mut b = b.borrow_mut();
        if b.is_some() {
            return false;
        }
        *b = Some(Vec::new());
        true
    });
    if !outermost {
        return f();
    }
    // Fires the deferred wakes even if `f` panics.
    struct Fire;
    impl Drop for Fire {
        fn drop(&mut self) {
            let deferred = BATCH.with(|b| b.borrow_mut().take()).unwrap_or_default();
            for w in deferred {
                w.deferred.store(false, Ordering::Release);
                w.task.wake();
            }
        }
    }
    let _fire = Fire;
    f()
}

/// A task's waker whose wakes inside a [`batch`] are deferred to its end,
/// and whose wakes while the task polls are noted for it
/// ([`TaskWaker::end_poll`]) instead of rescheduling it. The task calls
/// [`TaskWaker::begin_poll`] with its current waker on every poll and hands
/// out [`TaskWaker::waker`] instead.
#[derive(Default)]
pub struct TaskWaker {
    task: AtomicWaker,
    /// Recorded in the running batch, not yet fired.
    deferred: AtomicBool,
    /// [`IDLE`], [`POLLING`] or [`WOKEN`] (woken while polling).
    state: AtomicU8,
}

const IDLE: u8 = 0;
const POLLING: u8 = 1;
const WOKEN: u8 = 2;

impl TaskWaker {
    pub fn new() -> Arc<TaskWaker> {
        Arc::default()
    }

    /// The task is being polled, by `waker`'s task.
    pub fn begin_poll(&self, waker: &Waker) {
        self.task.register(waker);
        self.state.store(POLLING, Ordering::Release);
    }

    /// The poll is over; `true` if the task was woken meanwhile (it must
    /// poll again, or wake itself). A wake from now on reschedules it.
    pub fn end_poll(&self) -> bool {
        self.state.swap(IDLE, Ordering::AcqRel) == WOKEN
    }

    /// The waker to hand to what the task polls.
    pub fn waker(self: &Arc<Self>) -> Waker {
        Waker::from(Arc::clone(self))
    }
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // While the task polls, a wake (something it polls yielding, or an
        // event from another thread) is noted: it polls again before it
        // returns.
        match self
            .state
            .compare_exchange(POLLING, WOKEN, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) | Err(WOKEN) => return,
            Err(_) => {}
        }
        let deferred = BATCH.with(|b| {
            let Ok(mut b) = b.try_borrow_mut() else {
                return false;
            };
            let Some(list) = b.as_mut() else {
                return false;
            };
            if !self.deferred.swap(true, Ordering::AcqRel) {
                list.push(Arc::clone(self));
            }
            true
        });
        if !deferred {
            self.task.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn task() -> (Arc<Count>, Arc<TaskWaker>) {
        let count = Arc::new(Count::default());
        let tw = TaskWaker::new();
        tw.begin_poll(&Waker::from(Arc::clone(&count)));
        assert!(!tw.end_poll());
        (count, tw)
    }

    #[test]
    fn wakes_outside_a_batch_go_through_at_once() {
        let (count, tw) = task();
        tw.waker().wake_by_ref();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        tw.begin_poll(&Waker::from(Arc::clone(&count)));
        tw.end_poll();
        tw.waker().wake();
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn wakes_inside_a_batch_fire_once_at_its_end() {
        let (count, tw) = task();
        let (count2, tw2) = task();
        batch(|| {
            for _ in 0..100 {
                tw.waker().wake_by_ref();
            }
            tw2.waker().wake();
            // Nested: part of the outer batch.
            batch(|| tw.waker().wake_by_ref());
            assert_eq!(count.0.load(Ordering::SeqCst), 0, "deferred");
            assert_eq!(count2.0.load(Ordering::SeqCst), 0, "deferred");
        });
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "fired once");
        assert_eq!(count2.0.load(Ordering::SeqCst), 1, "fired once");
        // The next batch defers again.
        tw.begin_poll(&Waker::from(Arc::clone(&count)));
        tw.end_poll();
        batch(|| tw.waker().wake_by_ref());
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_batch_that_panics_still_fires_its_wakes() {
        let (count, tw) = task();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            batch(|| {
                tw.waker().wake_by_ref();
                panic!("in the batch");
            })
        }));
        assert!(r.is_err());
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        // No batch is left running on this thread.
        tw.begin_poll(&Waker::from(Arc::clone(&count)));
        tw.end_poll();
        tw.waker().wake_by_ref();
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn wakes_while_the_task_polls_are_noted_for_it() {
        let (count, tw) = task();
        tw.begin_poll(&Waker::from(Arc::clone(&count)));
        tw.waker().wake_by_ref();
        let w = tw.waker();
        std::thread::spawn(move || w.wake()).join().unwrap();
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "not rescheduled");
        assert!(tw.end_poll(), "noted");
        // Once the poll is over, a wake reschedules the task.
        tw.waker().wake_by_ref();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        tw.begin_poll(&Waker::from(Arc::clone(&count)));
        assert!(!tw.end_poll(), "not woken during this poll");
    }

    #[test]
    fn a_wake_from_another_thread_is_not_deferred() {
        let (count, tw) = task();
        batch(|| {
            let w = tw.waker();
            std::thread::spawn(move || w.wake()).join().unwrap();
            assert_eq!(count.0.load(Ordering::SeqCst), 1);
        });
    }
}
