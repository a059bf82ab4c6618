//! Shard selectors (Kubernetes 1.36+ `ShardedListAndWatch`, KEP-5866):
//! `shardSelector=shardRange(object.metadata.uid, '0x…', '0x…') || …`
//! selects the objects whose FNV-1a 64-bit hash of one metadata field lies
//! in one of the half-open ranges, so N replicas of a controller each list
//! and watch 1/N of a resource.
//!
//! The expression is parsed as CEL (the `cel` crate's parser, the grammar
//! cel-go uses) and never evaluated: the syntax tree is walked as
//! `k8s.io/apiserver/pkg/sharding.Parse` walks it, with its error texts.
//! Matching follows `k8s.io/apimachinery/pkg/sharding`.

use std::fmt;
use std::hash::Hasher;

use cel::common::ast::{Expr, LiteralValue};
use cel::parser::Parser;

use super::{Object, go_quote};

/// The object field a shard selector hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ShardField {
    Uid,
    Namespace,
}

impl ShardField {
    fn path(self) -> &'static str {
        match self {
            ShardField::Uid => "object.metadata.uid",
            ShardField::Namespace => "object.metadata.namespace",
        }
    }

    /// The field's value in `o` (absent reads as `""`, as Go's zero value).
    fn value(self, o: &Object) -> &str {
        match self {
            ShardField::Uid => o.uid.as_deref().unwrap_or(""),
            ShardField::Namespace => o.namespace.as_deref().unwrap_or(""),
        }
    }
}

/// One `shardRange(field, start, end)`: hashes in `[start, end)`; `end`
/// may be 2^64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardRange {
    pub start: u128,
    pub end: u128,
}

/// A parsed, non-empty shard selector: the ranges of one field, ORed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardSelector {
    field: ShardField,
    ranges: Vec<ShardRange>,
}

/// Why a shard selector does not parse: kube-apiserver's texts (its
/// handlers prefix them with `invalid shard selector: `).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ShardSelectorError(String);

/// cel-go's `ast.ExprKind` numbers, which kube-apiserver's messages print.
fn kind_number(e: &Expr) -> u8 {
    match e {
        Expr::Call(_) => 1,
        Expr::Comprehension(_) => 2,
        Expr::Ident(_) => 3,
        Expr::List(_) => 4,
        Expr::Literal(_) => 5,
        Expr::Map(_) => 6,
        Expr::Select(_) => 7,
        Expr::Struct(_) => 8,
        _ => 0,
    }
}

/// FNV-1a 64-bit of `value` (apimachinery's `sharding.HashField`).
pub fn hash_field(value: &str) -> u64 {
    let mut h = fnv::FnvHasher::default();
    h.write(value.as_bytes());
    h.finish()
}

impl ShardSelector {
    /// Parses `expr` as kube-apiserver's `sharding.Parse` does.
    pub fn parse(expr: &str) -> Result<ShardSelector, ShardSelectorError> {
        let err = |m: String| ShardSelectorError(m);
        let expr = expr.trim();
        if expr.is_empty() {
            return Err(err(
                "empty shard selector is not allowed; omit the parameter for unfiltered lists"
                    .into(),
            ));
        }
        let parsed = Parser::new().parse(expr).map_err(|e| {
            let first = e.errors.first().map(|e| e.msg.as_str()).unwrap_or("");
            err(format!("CEL parse error: {first}"))
        })?;
        let mut reqs = Vec::new();
        walk(&parsed.expr, &mut reqs)?;
        let Some((field, _)) = reqs.first().copied() else {
            return Err(err("empty shard selector".into()));
        };
        for (f, _) in &reqs[1..] {
            if *f != field {
                return Err(err(format!(
                    "all shard ranges must use the same field, got {} and {}",
                    go_quote(field.path()),
                    go_quote(f.path())
                )));
            }
        }
        Ok(ShardSelector {
            field,
            ranges: reqs.into_iter().map(|(_, r)| r).collect(),
        })
    }

    pub fn field(&self) -> ShardField {
        self.field
    }

    pub fn ranges(&self) -> &[ShardRange] {
        &self.ranges
    }

    /// The hash of `o`'s shard field, which [`contains`](Self::contains)
    /// tests.
    pub fn hash_of(&self, o: &Object) -> u64 {
        hash_field(self.field.value(o))
    }

    /// Whether `hash` lies in one of the ranges.
    pub fn contains(&self, hash: u64) -> bool {
        let h = u128::from(hash);
        self.ranges.iter().any(|r| r.start <= h && h < r.end)
    }

    /// Whether `o` is in the shard.
    pub fn matches(&self, o: &Object) -> bool {
        self.contains(self.hash_of(o))
    }
}

/// The wire form kube-apiserver echoes in a List's `metadata.shardInfo`.
impl fmt::Display for ShardSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(" || ")?;
            }
            write!(
                f,
                "shardRange({}, '{}', '{}')",
                self.field.path(),
                hex(r.start),
                hex(r.end)
            )?;
        }
        Ok(())
    }
}

/// `0x` and 16 lowercase digits (17 for 2^64), as the selector was given.
fn hex(v: u128) -> String {
    format!("0x{v:016x}")
}

fn walk(e: &Expr, out: &mut Vec<(ShardField, ShardRange)>) -> Result<(), ShardSelectorError> {
    match e {
        Expr::Call(call) => {
            if call.func_name == "_||_" {
                if call.args.len() != 2 {
                    return Err(ShardSelectorError(
                        "|| operator requires exactly 2 arguments".into(),
                    ));
                }
                walk(&call.args[0].expr, out)?;
                return walk(&call.args[1].expr, out);
            }
            if call.func_name == "shardRange" {
                out.push(shard_range(&call.args)?);
                return Ok(());
            }
            Err(ShardSelectorError(format!(
                "unsupported function {}; only shardRange() and || are allowed",
                go_quote(&call.func_name)
            )))
        }
        // A `has()` test: cel-go, parsing without macros, sees the call.
        Expr::Select(s) if s.test => Err(ShardSelectorError(
            "unsupported function \"has\"; only shardRange() and || are allowed".into(),
        )),
        other => Err(ShardSelectorError(format!(
            "unexpected expression kind {}; expected shardRange() call or || operator",
            kind_number(other)
        ))),
    }
}

fn shard_range(
    args: &[cel::common::ast::IdedExpr],
) -> Result<(ShardField, ShardRange), ShardSelectorError> {
    let err = |m: String| ShardSelectorError(m);
    if args.len() != 3 {
        return Err(err(format!(
            "shardRange() requires exactly 3 arguments, got {}",
            args.len()
        )));
    }
    let path = field_path(&args[0].expr)
        .map_err(|e| err(format!("shardRange() first argument: {}", e.0)))?;
    let field = match path.as_str() {
        "object.metadata.uid" => ShardField::Uid,
        "object.metadata.namespace" => ShardField::Namespace,
        _ => {
            return Err(err(format!(
                "unsupported field path {}; supported: object.metadata.uid, object.metadata.namespace",
                go_quote(&path)
            )));
        }
    };
    let start = hex_literal(&args[1].expr, "hexStart")?;
    let end = hex_literal(&args[2].expr, "hexEnd")?;
    if start.0 >= end.0 {
        return Err(err(format!(
            "shard range start {} must be less than end {}",
            start.1, end.1
        )));
    }
    Ok((
        field,
        ShardRange {
            start: start.0,
            end: end.0,
        },
    ))
}

fn field_path(e: &Expr) -> Result<String, ShardSelectorError> {
    match e {
        Expr::Ident(name) => Ok(name.clone()),
        Expr::Select(s) if !s.test => Ok(format!("{}.{}", field_path(&s.operand.expr)?, s.field)),
        other => Err(ShardSelectorError(format!(
            "expected field path (e.g. object.metadata.uid), got expression kind {}",
            kind_number(other)
        ))),
    }
}

/// A `'0x…'` literal of 16 hex digits (or 2^64): its value and text.
fn hex_literal(e: &Expr, name: &str) -> Result<(u128, String), ShardSelectorError> {
    let err = |m: String| ShardSelectorError(m);
    let Expr::Literal(lit) = e else {
        return Err(err(format!(
            "{name} must be a string literal (e.g. '0xff'), got expression kind {}",
            kind_number(e)
        )));
    };
    let s = match lit {
        LiteralValue::String(s) => s.to_string(),
        // Go's `%T` of the literal's native value.
        other => {
            let t = match other {
                LiteralValue::Int(_) => "int64",
                LiteralValue::UInt(_) => "uint64",
                LiteralValue::Double(_) => "float64",
                LiteralValue::Boolean(_) => "bool",
                LiteralValue::Bytes(_) => "[]uint8",
                LiteralValue::Null => "structpb.NullValue",
                LiteralValue::String(_) => "string",
            };
            return Err(err(format!("{name} must be a string literal, got {t}")));
        }
    };
    let Some(digits) = s.strip_prefix("0x") else {
        return Err(err(format!(
            "{name} must have '0x' prefix, got {}",
            go_quote(&s)
        )));
    };
    if digits.is_empty() {
        return Err(err(format!("{name}: hex value is required after '0x'")));
    }
    let n = digits.chars().count();
    if n > 17 {
        return Err(err(format!(
            "{name}: hex value too long ({n} chars, max 17): {}",
            go_quote(digits)
        )));
    }
    if let Some(c) = digits
        .chars()
        .find(|c| !c.is_ascii_digit() && !('a'..='f').contains(c))
    {
        return Err(err(format!(
            "{name}: invalid hex character {} in {}",
            go_quote(&c.to_string()),
            go_quote(&s)
        )));
    }
    if n == 17 {
        if s != "0x10000000000000000" {
            return Err(err(format!(
                "{name}: 17-digit hex value must be '0x10000000000000000' (2^64), got {}",
                go_quote(&s)
            )));
        }
    } else if n != 16 {
        let padded = format!("0x{}{digits}", "0".repeat(16 - n));
        return Err(err(format!(
            "{name} must be a 0x-prefixed 16-digit hex value, got {} (did you mean {}?)",
            go_quote(&s),
            go_quote(&padded)
        )));
    }
    let v = u128::from_str_radix(digits, 16)
        .map_err(|e| err(format!("{name}: invalid hex value {}: {e}", go_quote(&s))))?;
    Ok((v, s))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HALF: &str =
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')";

    fn parse_err(s: &str) -> String {
        match ShardSelector::parse(s) {
            Ok(sel) => panic!("{s:?} parsed as {sel}"),
            Err(e) => e.0,
        }
    }

    /// apimachinery's `hash_test.go` values.
    #[test]
    fn hash_is_fnv1a_64() {
        assert_eq!(format!("{:016x}", hash_field("")), "cbf29ce484222325");
        assert_eq!(format!("{:016x}", hash_field("a")), "af63dc4c8601ec8c");
        assert_eq!(format!("{:016x}", hash_field("foobar")), "85944171f73967e8");
    }

    #[test]
    fn parses_and_prints_the_wire_form() {
        let sel = ShardSelector::parse(&format!(
            "  {HALF} || shardRange(object.metadata.uid, '0x8000000000000000', '0x10000000000000000') "
        ))
        .expect("parse");
        assert_eq!(sel.field(), ShardField::Uid);
        assert_eq!(
            sel.ranges(),
            &[
                ShardRange {
                    start: 0,
                    end: 1 << 63
                },
                ShardRange {
                    start: 1 << 63,
                    end: 1 << 64
                }
            ]
        );
        assert_eq!(
            sel.to_string(),
            format!(
                "{HALF} || shardRange(object.metadata.uid, '0x8000000000000000', '0x10000000000000000')"
            )
        );
        // Three ORed ranges keep their order (cel-go balances the tree).
        let three = ShardSelector::parse(
            "shardRange(object.metadata.namespace, '0x0000000000000000', '0x0000000000000001') || \
             shardRange(object.metadata.namespace, '0x0000000000000005', '0x0000000000000006') || \
             shardRange(object.metadata.namespace, '0x0000000000000002', '0x0000000000000003')",
        )
        .expect("parse");
        let starts: Vec<u128> = three.ranges().iter().map(|r| r.start).collect();
        assert_eq!(starts, [0, 5, 2]);
    }

    #[test]
    fn matches_by_hash_range() {
        let lower = ShardSelector::parse(HALF).expect("parse");
        let upper = ShardSelector::parse(
            "shardRange(object.metadata.uid, '0x8000000000000000', '0x10000000000000000')",
        )
        .expect("parse");
        for uid in ["", "a", "foobar", "0b4c7d1e-0000-4000-8000-000000000001"] {
            let h = hash_field(uid);
            assert_eq!(lower.contains(h), h < 1 << 63, "{uid}");
            assert_ne!(lower.contains(h), upper.contains(h), "{uid}");
        }
        assert!(upper.contains(u64::MAX));
        assert!(lower.contains(0));
        assert!(!lower.contains(1 << 63));
    }

    /// kube-apiserver's `parser_test.go` error cases, its texts.
    #[test]
    fn bad_selectors_get_kube_apiservers_texts() {
        let cases: &[(&str, &str)] = &[
            (
                "   ",
                "empty shard selector is not allowed; omit the parameter for unfiltered lists",
            ),
            (
                "shardRange(object.metadata.name, '0x0000000000000000', '0x8000000000000000')",
                "unsupported field path \"object.metadata.name\"; supported: object.metadata.uid, object.metadata.namespace",
            ),
            (
                "shardRange(object.metadata.uid, '0x8000000000000000', '0x0000000000000000')",
                "shard range start 0x8000000000000000 must be less than end 0x0000000000000000",
            ),
            (
                "shardRange(object.metadata.uid, '0x0', '0x8000000000000000')",
                "hexStart must be a 0x-prefixed 16-digit hex value, got \"0x0\" (did you mean \"0x0000000000000000\"?)",
            ),
            (
                "shardRange(object.metadata.uid, '0000000000000000', '0x8000000000000000')",
                "hexStart must have '0x' prefix, got \"0000000000000000\"",
            ),
            (
                "shardRange(object.metadata.uid, '0x000000000000000G', '0x8000000000000000')",
                "hexStart: invalid hex character \"G\" in \"0x000000000000000G\"",
            ),
            (
                "shardRange(object.metadata.uid, '0x0000000000000000', '0x20000000000000000')",
                "hexEnd: 17-digit hex value must be '0x10000000000000000' (2^64), got \"0x20000000000000000\"",
            ),
            (
                "shardRange(object.metadata.uid, '0x0000000000000000', '0x100000000000000000')",
                "hexEnd: hex value too long (18 chars, max 17): \"100000000000000000\"",
            ),
            (
                "shardRange(object.metadata.uid, '0x', '0x8000000000000000')",
                "hexStart: hex value is required after '0x'",
            ),
            (
                "shardRange(object.metadata.uid, 0, '0x8000000000000000')",
                "hexStart must be a string literal, got int64",
            ),
            (
                "shardRange(object.metadata.uid, x, '0x8000000000000000')",
                "hexStart must be a string literal (e.g. '0xff'), got expression kind 3",
            ),
            (
                "shardRange(object.metadata.uid, '0x0000000000000000')",
                "shardRange() requires exactly 3 arguments, got 2",
            ),
            (
                "shardRange('x', '0x0000000000000000', '0x8000000000000000')",
                "shardRange() first argument: expected field path (e.g. object.metadata.uid), got expression kind 5",
            ),
            (
                "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') && true",
                "unsupported function \"_&&_\"; only shardRange() and || are allowed",
            ),
            (
                "size(object.metadata.uid)",
                "unsupported function \"size\"; only shardRange() and || are allowed",
            ),
            (
                "'0x0'",
                "unexpected expression kind 5; expected shardRange() call or || operator",
            ),
            (
                "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') || \
                 shardRange(object.metadata.namespace, '0x8000000000000000', '0x10000000000000000')",
                "all shard ranges must use the same field, got \"object.metadata.uid\" and \"object.metadata.namespace\"",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(parse_err(input), *want, "{input}");
        }
        assert!(parse_err("shardRange(").starts_with("CEL parse error: Syntax error: "));
    }
}
