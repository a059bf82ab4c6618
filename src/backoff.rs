//! `Backoff`: the one exponential backoff of the daemon (Kubernetes'
//! `wait.Backoff`): the reflector's relist/rewatch loop and the storage
//! layer's retried reads both step it.

use std::time::Duration;

use rand::Rng;

/// Exponential backoff from `start`, doubling up to `max`, with optional
/// +-50% jitter so many clients retrying together spread out.
#[derive(Debug, Clone)]
pub struct Backoff {
    start: Duration,
    max: Duration,
    next: Duration,
    jitter: bool,
}

impl Backoff {
    pub fn new(start: Duration, max: Duration) -> Backoff {
        Backoff {
            start,
            max: max.max(start),
            next: start,
            jitter: false,
        }
    }

    /// Each delay is multiplied by a random factor in [0.5, 1.5).
    pub fn with_jitter(mut self) -> Backoff {
        self.jitter = true;
        self
    }

    /// Back to the first step (after a success).
    pub fn reset(&mut self) {
        self.next = self.start;
    }

    /// The delay before the next attempt; doubles the one after.
    pub fn step(&mut self) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(self.max);
        if self.jitter {
            base.mul_f64(rand::rng().random_range(0.5..1.5))
        } else {
            base
        }
    }

    /// The delay [`step`](Self::step) would return next, without jitter.
    pub fn peek(&self) -> Duration {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_max_and_resets() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(50), ms(300));
        let steps: Vec<Duration> = (0..5).map(|_| b.step()).collect();
        assert_eq!(steps, [ms(50), ms(100), ms(200), ms(300), ms(300)]);
        b.reset();
        assert_eq!(b.step(), ms(50));
    }

    #[test]
    fn jitter_stays_within_half_either_side() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(1)).with_jitter();
        for _ in 0..100 {
            let d = b.step();
            assert!(
                d >= Duration::from_millis(500) && d < Duration::from_millis(1500),
                "{d:?}"
            );
        }
    }
}
