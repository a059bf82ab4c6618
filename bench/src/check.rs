//! The lost/duplicate checker of the fan-out scenario.
//!
//! A watcher that starts at revision R0 must see every write of the write log
//! (all of which happen after R0) exactly once and in revision order. This
//! module is pure so it is unit tested without etcd, with injected gaps,
//! duplicates and foreign events.

use serde::Serialize;

/// What one watcher (or the sum over many) got compared with the write log.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CheckResult {
    /// Revisions in the write log.
    pub expected: u64,
    /// Events received (every receipt, duplicates included).
    pub received: u64,
    /// Revisions of the write log never received.
    pub lost: u64,
    /// Extra receipts of a revision already received.
    pub duplicated: u64,
    /// Receipts of a revision that is not in the write log.
    pub unexpected: u64,
    /// Receipts whose revision is lower than the receipt before.
    pub out_of_order: u64,
}

impl CheckResult {
    /// True when the watcher saw exactly the write log, in order.
    #[cfg(test)]
    pub fn is_clean(&self) -> bool {
        self.lost == 0 && self.duplicated == 0 && self.unexpected == 0 && self.out_of_order == 0
    }

    /// Adds another watcher's result to this one.
    pub fn add(&mut self, o: &CheckResult) {
        self.expected += o.expected;
        self.received += o.received;
        self.lost += o.lost;
        self.duplicated += o.duplicated;
        self.unexpected += o.unexpected;
        self.out_of_order += o.out_of_order;
    }
}

/// Compares the revisions one watcher received (in receipt order) with the
/// revisions of the write log (any order; duplicates in the log count once).
pub fn check_deliveries(write_log: &[i64], received: &[i64]) -> CheckResult {
    let mut expected: Vec<i64> = write_log.to_vec();
    if !expected.is_sorted() {
        expected.sort_unstable();
    }
    expected.dedup();

    let out_of_order = received.windows(2).filter(|w| w[1] < w[0]).count() as u64;
    let sorted_storage;
    let got: &[i64] = if received.is_sorted() {
        received
    } else {
        let mut v = received.to_vec();
        v.sort_unstable();
        sorted_storage = v;
        &sorted_storage
    };

    let (mut lost, mut duplicated, mut unexpected) = (0u64, 0u64, 0u64);
    let (mut i, mut j) = (0usize, 0usize);
    while i < expected.len() || j < got.len() {
        match (expected.get(i), got.get(j)) {
            (Some(&e), Some(&g)) if e == g => {
                // Count every further receipt of the same revision as a duplicate.
                let mut k = j + 1;
                while k < got.len() && got[k] == g {
                    k += 1;
                }
                duplicated += (k - j - 1) as u64;
                i += 1;
                j = k;
            }
            (Some(&e), Some(&g)) if e < g => {
                lost += 1;
                i += 1;
            }
            (Some(_), Some(_)) | (None, Some(_)) => {
                unexpected += 1;
                j += 1;
            }
            (Some(_), None) => {
                lost += 1;
                i += 1;
            }
            (None, None) => break,
        }
    }
    CheckResult {
        expected: expected.len() as u64,
        received: received.len() as u64,
        lost,
        duplicated,
        unexpected,
        out_of_order,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_run() {
        let log = [5, 6, 7, 9];
        let r = check_deliveries(&log, &[5, 6, 7, 9]);
        assert!(r.is_clean(), "{r:?}");
        assert_eq!(r.expected, 4);
        assert_eq!(r.received, 4);
    }

    #[test]
    fn detects_gap_duplicate_unexpected_and_order() {
        let log = [5, 6, 7, 9];
        let gap = check_deliveries(&log, &[5, 7, 9]);
        assert_eq!((gap.lost, gap.duplicated), (1, 0));
        let dup = check_deliveries(&log, &[5, 6, 6, 7, 9]);
        assert_eq!((dup.lost, dup.duplicated), (0, 1));
        let extra = check_deliveries(&log, &[5, 6, 7, 8, 9]);
        assert_eq!((extra.lost, extra.unexpected), (0, 1));
        let swapped = check_deliveries(&log, &[5, 7, 6, 9]);
        assert_eq!((swapped.lost, swapped.out_of_order), (0, 1));
        assert!(check_deliveries(&log, &[]).lost == 4);
    }

    /// A write log like the bench's: revisions of consecutive puts, starting
    /// after some setup revisions.
    fn write_log(n: i64) -> Vec<i64> {
        (0..n).map(|i| 100 + i).collect()
    }

    #[test]
    fn checker_detects_an_injected_gap() {
        let log = write_log(50);
        let mut got = log.clone();
        got.remove(17);
        got.remove(30);
        let r = check_deliveries(&log, &got);
        assert_eq!(r.lost, 2, "{r:?}");
        assert_eq!((r.duplicated, r.unexpected, r.out_of_order), (0, 0, 0));
        assert!(!r.is_clean());
        // A watcher that stopped early lost the tail.
        let r = check_deliveries(&log, &log[..40]);
        assert_eq!(r.lost, 10);
    }

    #[test]
    fn checker_detects_an_injected_duplicate() {
        let log = write_log(50);
        let mut got = log.clone();
        got.insert(21, got[20]);
        // A replay of an earlier event later in the stream is a duplicate and out of order.
        got.push(log[3]);
        let r = check_deliveries(&log, &got);
        assert_eq!(r.duplicated, 2, "{r:?}");
        assert_eq!(r.out_of_order, 1, "{r:?}");
        assert_eq!((r.lost, r.unexpected), (0, 0));
        assert!(!r.is_clean());
    }

    #[test]
    fn checker_detects_foreign_events_and_accepts_an_unsorted_log() {
        let log = vec![7, 3, 5];
        let r = check_deliveries(&log, &[3, 4, 5, 7]);
        assert_eq!((r.lost, r.unexpected, r.expected), (0, 1, 3));
    }
}
