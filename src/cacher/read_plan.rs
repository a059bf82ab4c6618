//! The read plan: which resourceVersion a Get, List or Watch is served at
//! (the table of docs/DESIGN.md section 2, 400 cells included), decided from the
//! request alone before the cache is asked. The [`delegator`](super::delegator)
//! then serves the plan from a snapshot or from etcd.

use super::continue_token;
use super::{CacherError, ListRequest, ResourceVersionMatch, WatchRequest};

/// How a Get or List read is to be served (the cells of docs/DESIGN.md section 2's table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReadPlan {
    /// RV unset: consistent read.
    MostRecent,
    /// RV "0": whatever the cache has.
    Any,
    NotOlderThan(i64),
    Exact(i64),
    /// A continue token: exact at the token's RV, starting at its key.
    Continue {
        rv: i64,
        start_key: String,
        /// From the token: (items in the whole list, items returned so far).
        counts: Option<(u64, u64)>,
    },
}

impl ReadPlan {
    /// The least RV at which the current snapshot answers this plan without
    /// waiting (`Any`: whatever it has), or `None`: the plan must read
    /// consistently or at an exact RV.
    pub(crate) fn current_at_least(&self) -> Option<i64> {
        match self {
            ReadPlan::Any => Some(0),
            ReadPlan::NotOlderThan(n) => Some(*n),
            _ => None,
        }
    }
}

impl From<continue_token::ContinueToken> for ReadPlan {
    fn from(t: continue_token::ContinueToken) -> ReadPlan {
        ReadPlan::Continue {
            rv: t.rv,
            start_key: t.start_key,
            counts: t.counts,
        }
    }
}

/// Applies the List table of docs/DESIGN.md section 2, 400 cells included.
pub(crate) fn plan_list(req: &ListRequest, key_prefix: &str) -> Result<ReadPlan, CacherError> {
    let rv = req.resource_version;
    if let Some(n) = rv
        && n < 0
    {
        return Err(CacherError::BadRequest(format!(
            "invalid resource version: {n}"
        )));
    }
    let has_limit = req.limit.is_some_and(|l| l > 0);
    let token = match req.continue_token.as_deref() {
        Some(t) if !t.is_empty() => {
            Some(continue_token::decode(t, key_prefix).map_err(CacherError::BadRequest)?)
        }
        _ => None,
    };
    use ResourceVersionMatch::*;
    match (req.resource_version_match, rv, token) {
        (Some(Exact), None | Some(0), _) => Err(CacherError::BadRequest(
            "resourceVersionMatch \"Exact\" requires a non-zero resourceVersion".into(),
        )),
        (Some(NotOlderThan), None, _) => Err(CacherError::BadRequest(
            "resourceVersionMatch is forbidden unless resourceVersion is provided".into(),
        )),
        // "Exact N" with a continue token: only the token's own RV is exact N.
        (Some(Exact), Some(n), Some(t)) => {
            if t.rv == n {
                Ok(ReadPlan::from(t))
            } else {
                Err(CacherError::BadRequest(format!(
                    "resourceVersion {n} does not match the continue token's {}",
                    t.rv
                )))
            }
        }
        (Some(Exact), Some(n), None) => Ok(ReadPlan::Exact(n)),
        (Some(NotOlderThan), Some(n), Some(t)) => {
            if t.rv >= n {
                Ok(ReadPlan::from(t))
            } else {
                Err(CacherError::BadRequest(format!(
                    "the continue token's resourceVersion {} is older than {n}",
                    t.rv
                )))
            }
        }
        (Some(NotOlderThan), Some(0), None) => Ok(ReadPlan::Any),
        (Some(NotOlderThan), Some(n), None) => Ok(ReadPlan::NotOlderThan(n)),
        (None, None | Some(0), Some(t)) => Ok(ReadPlan::from(t)),
        (None, Some(_), Some(_)) => Err(CacherError::BadRequest(
            "specifying resource version is not allowed when using continue".into(),
        )),
        (None, None, None) => Ok(ReadPlan::MostRecent),
        (None, Some(0), None) => Ok(ReadPlan::Any),
        (None, Some(n), None) if has_limit => Ok(ReadPlan::Exact(n)),
        (None, Some(n), None) => Ok(ReadPlan::NotOlderThan(n)),
    }
}

/// Get: unset -> most recent; `0` -> any; `N` -> not older than N.
pub(crate) fn plan_get(rv: Option<i64>) -> Result<ReadPlan, CacherError> {
    match rv {
        None => Ok(ReadPlan::MostRecent),
        Some(0) => Ok(ReadPlan::Any),
        Some(n) if n < 0 => Err(CacherError::BadRequest(format!(
            "invalid resource version: {n}"
        ))),
        Some(n) => Ok(ReadPlan::NotOlderThan(n)),
    }
}

/// Where a watch starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WatchPlan {
    /// Send the state (as ADDED) at a snapshot chosen by `read`, then changes;
    /// `end_bookmark`: then a BOOKMARK with the initial-events-end annotation.
    Initial { read: ReadPlan, end_bookmark: bool },
    /// No initial state: changes after the most recent RV (consistent) or any.
    FromNow { read: ReadPlan },
    /// Exactly the events after N.
    After(i64),
}

/// Applies the watch rules of docs/DESIGN.md section 2.
pub(crate) fn plan_watch(req: &WatchRequest) -> Result<WatchPlan, CacherError> {
    if let Some(n) = req.resource_version
        && n < 0
    {
        return Err(CacherError::BadRequest(format!(
            "invalid resource version: {n}"
        )));
    }
    match req.send_initial_events {
        None => {
            if req.resource_version_match.is_some() {
                return Err(CacherError::BadRequest(
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"
                        .into(),
                ));
            }
            Ok(match req.resource_version {
                None => WatchPlan::Initial {
                    read: ReadPlan::MostRecent,
                    end_bookmark: false,
                },
                Some(0) => WatchPlan::Initial {
                    read: ReadPlan::Any,
                    end_bookmark: false,
                },
                Some(n) => WatchPlan::After(n),
            })
        }
        Some(send) => {
            if req.resource_version_match != Some(ResourceVersionMatch::NotOlderThan) {
                return Err(CacherError::BadRequest(
                    "sendInitialEvents requires resourceVersionMatch=NotOlderThan".into(),
                ));
            }
            if send && !req.allow_bookmarks {
                return Err(CacherError::BadRequest(
                    "sendInitialEvents=true requires allowWatchBookmarks=true".into(),
                ));
            }
            let read = match req.resource_version {
                None => ReadPlan::MostRecent,
                Some(0) => ReadPlan::Any,
                Some(n) => ReadPlan::NotOlderThan(n),
            };
            Ok(if send {
                WatchPlan::Initial {
                    read,
                    end_bookmark: true,
                }
            } else {
                match read {
                    ReadPlan::NotOlderThan(n) => WatchPlan::After(n),
                    read => WatchPlan::FromNow { read },
                }
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "/registry/pods/";

    fn list(
        rv: Option<i64>,
        m: Option<ResourceVersionMatch>,
        limit: Option<i64>,
        cont: bool,
    ) -> Result<ReadPlan, CacherError> {
        let tok = continue_token::encode(7, "/registry/pods/ns/a", P, None);
        plan_list(
            &ListRequest {
                resource_version: rv,
                resource_version_match: m,
                limit,
                continue_token: cont.then_some(tok),
                ..Default::default()
            },
            P,
        )
    }

    fn is_bad(r: Result<ReadPlan, CacherError>) -> bool {
        matches!(r, Err(CacherError::BadRequest(_)))
    }

    #[test]
    fn list_table_match_unset() {
        use ReadPlan::*;
        let cont = Continue {
            rv: 7,
            start_key: "/registry/pods/ns/a\0".into(),
            counts: None,
        };
        // no limit
        assert_eq!(list(None, None, None, false), Ok(MostRecent));
        assert_eq!(list(Some(0), None, None, false), Ok(Any));
        assert_eq!(list(Some(5), None, None, false), Ok(NotOlderThan(5)));
        // limit, no continue
        assert_eq!(list(None, None, Some(2), false), Ok(MostRecent));
        assert_eq!(list(Some(0), None, Some(2), false), Ok(Any));
        assert_eq!(list(Some(5), None, Some(2), false), Ok(Exact(5)));
        // continue
        assert_eq!(list(None, None, Some(2), true), Ok(cont.clone()));
        assert_eq!(list(Some(0), None, Some(2), true), Ok(cont));
        assert!(is_bad(list(Some(5), None, Some(2), true)));
        // limit 0 counts as no limit
        assert_eq!(list(Some(5), None, Some(0), false), Ok(NotOlderThan(5)));
    }

    #[test]
    fn list_table_match_set() {
        use ReadPlan::{Any, Continue};
        const EXACT: Option<ResourceVersionMatch> = Some(ResourceVersionMatch::Exact);
        const NOT_OLDER: Option<ResourceVersionMatch> = Some(ResourceVersionMatch::NotOlderThan);
        for limit in [None, Some(2)] {
            assert!(is_bad(list(None, EXACT, limit, false)));
            assert!(is_bad(list(Some(0), EXACT, limit, false)));
            assert_eq!(list(Some(5), EXACT, limit, false), Ok(ReadPlan::Exact(5)));
            assert!(is_bad(list(None, NOT_OLDER, limit, false)));
            assert_eq!(list(Some(0), NOT_OLDER, limit, false), Ok(Any));
            assert_eq!(
                list(Some(5), NOT_OLDER, limit, false),
                Ok(ReadPlan::NotOlderThan(5))
            );
        }
        assert!(is_bad(list(None, EXACT, Some(2), true)));
        assert!(is_bad(list(Some(0), EXACT, Some(2), true)));
        assert!(is_bad(list(Some(5), EXACT, Some(2), true)));
        assert!(matches!(
            list(Some(7), EXACT, Some(2), true),
            Ok(Continue { rv: 7, .. })
        ));
        assert!(is_bad(list(None, NOT_OLDER, Some(2), true)));
        assert!(matches!(
            list(Some(0), NOT_OLDER, Some(2), true),
            Ok(Continue { rv: 7, .. })
        ));
    }

    #[test]
    fn bad_tokens_and_negative_rvs_are_400() {
        let r = plan_list(
            &ListRequest {
                continue_token: Some("garbage!".into()),
                ..Default::default()
            },
            P,
        );
        assert!(is_bad(r));
        assert!(is_bad(list(Some(-1), None, None, false)));
        assert!(matches!(
            plan_get(Some(-1)),
            Err(CacherError::BadRequest(_))
        ));
        assert_eq!(plan_get(None), Ok(ReadPlan::MostRecent));
        assert_eq!(plan_get(Some(0)), Ok(ReadPlan::Any));
        assert_eq!(plan_get(Some(9)), Ok(ReadPlan::NotOlderThan(9)));
    }

    #[test]
    fn watch_rules() {
        use ResourceVersionMatch::*;
        let w = |rv, m, sie, bm| {
            plan_watch(&WatchRequest {
                resource_version: rv,
                resource_version_match: m,
                send_initial_events: sie,
                allow_bookmarks: bm,
                ..Default::default()
            })
        };
        assert_eq!(
            w(None, None, None, false),
            Ok(WatchPlan::Initial {
                read: ReadPlan::MostRecent,
                end_bookmark: false
            })
        );
        assert_eq!(
            w(Some(0), None, None, true),
            Ok(WatchPlan::Initial {
                read: ReadPlan::Any,
                end_bookmark: false
            })
        );
        assert_eq!(w(Some(4), None, None, true), Ok(WatchPlan::After(4)));
        assert!(matches!(
            w(Some(4), Some(Exact), None, true),
            Err(CacherError::BadRequest(_))
        ));
        assert!(matches!(
            w(Some(4), None, Some(true), true),
            Err(CacherError::BadRequest(_))
        ));
        assert!(matches!(
            w(Some(4), Some(NotOlderThan), Some(true), false),
            Err(CacherError::BadRequest(_))
        ));
        assert!(matches!(
            w(Some(4), Some(Exact), Some(true), true),
            Err(CacherError::BadRequest(_))
        ));
        assert_eq!(
            w(Some(4), Some(NotOlderThan), Some(true), true),
            Ok(WatchPlan::Initial {
                read: ReadPlan::NotOlderThan(4),
                end_bookmark: true
            })
        );
        assert_eq!(
            w(None, Some(NotOlderThan), Some(false), false),
            Ok(WatchPlan::FromNow {
                read: ReadPlan::MostRecent
            })
        );
        assert_eq!(
            w(Some(4), Some(NotOlderThan), Some(false), false),
            Ok(WatchPlan::After(4))
        );
    }
}
