//! Label and field selectors, with the syntax and validation of Kubernetes
//! `labels.Parse` and `fields.ParseSelector`.
//!
//! Label selectors: comma-separated requirements `a=b`, `a==b`, `a!=b`,
//! `a in (x,y)`, `a notin (x)`, `a` (exists), `!a` (does not exist), and
//! `a>1` / `a<1` (integer comparison). Keys must be qualified names
//! (`[prefix/]name`), values valid label values (at most 63 characters of
//! alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric, or empty).
//!
//! Field selectors: comma-separated `f=v`, `f==v`, `f!=v`; in values `\\`,
//! `\,` and `\=` escape `\`, `,` and `=`. Only `metadata.name`,
//! `metadata.namespace` and the resource's configured index paths are
//! accepted.
//!
//! The empty string (or, for labels, only whitespace) selects everything.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use super::validation::is_dns1123_subdomain;
use super::{FIELD_NAME, FIELD_NAMESPACE, Object};

/// A selector string that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// The label selector does not parse or fails validation.
    #[error("{message}")]
    InvalidLabelSelector { selector: String, message: String },
    /// The field selector does not parse (bad term, bad escape).
    #[error("{message}")]
    InvalidFieldSelector { selector: String, message: String },
    /// The field selector names a field that is neither `metadata.name`,
    /// `metadata.namespace` nor a configured index path.
    #[error("field label not supported: {field}")]
    FieldNotSupported { field: String },
}

// ---------------------------------------------------------------------------
// Label selectors

/// The operator of a label [`Requirement`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LabelOp {
    /// `a=b`
    Equals,
    /// `a==b`
    DoubleEquals,
    /// `a!=b` (also true when the label is absent)
    NotEquals,
    /// `a in (x,y)`
    In,
    /// `a notin (x,y)` (also true when the label is absent)
    NotIn,
    /// `a`
    Exists,
    /// `!a`
    DoesNotExist,
    /// `a>1` (integer comparison; false when the label is absent or not an integer)
    GreaterThan,
    /// `a<1`
    LessThan,
}

/// One requirement of a [`LabelSelector`]. `values` is sorted and deduplicated.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Requirement {
    pub key: String,
    pub op: LabelOp,
    pub values: Vec<String>,
}

impl Requirement {
    /// Whether the label set satisfies this requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let has = |v: &String| self.values.binary_search(v).is_ok();
        match self.op {
            LabelOp::Equals | LabelOp::DoubleEquals | LabelOp::In => {
                labels.get(&self.key).is_some_and(has)
            }
            LabelOp::NotEquals | LabelOp::NotIn => !labels.get(&self.key).is_some_and(has),
            LabelOp::Exists => labels.contains_key(&self.key),
            LabelOp::DoesNotExist => !labels.contains_key(&self.key),
            LabelOp::GreaterThan | LabelOp::LessThan => {
                let Some(have) = labels.get(&self.key).and_then(|v| v.parse::<i64>().ok()) else {
                    return false;
                };
                let Some(want) = self.values.first().and_then(|v| v.parse::<i64>().ok()) else {
                    return false;
                };
                if self.op == LabelOp::GreaterThan {
                    have > want
                } else {
                    have < want
                }
            }
        }
    }

    /// The single value this requirement pins the key to (`=`, `==`, `in`
    /// with one value).
    pub fn exact_value(&self) -> Option<&str> {
        match (self.op, self.values.as_slice()) {
            (LabelOp::Equals | LabelOp::DoubleEquals | LabelOp::In, [v]) => Some(v),
            _ => None,
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let first = self.values.first().map(String::as_str).unwrap_or("");
        match self.op {
            LabelOp::Exists => write!(f, "{}", self.key),
            LabelOp::DoesNotExist => write!(f, "!{}", self.key),
            LabelOp::Equals => write!(f, "{}={first}", self.key),
            LabelOp::DoubleEquals => write!(f, "{}=={first}", self.key),
            LabelOp::NotEquals => write!(f, "{}!={first}", self.key),
            LabelOp::GreaterThan => write!(f, "{}>{first}", self.key),
            LabelOp::LessThan => write!(f, "{}<{first}", self.key),
            LabelOp::In => write!(f, "{} in ({})", self.key, self.values.join(",")),
            LabelOp::NotIn => write!(f, "{} notin ({})", self.key, self.values.join(",")),
        }
    }
}

/// A parsed label selector: the AND of its requirements.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// The selector that matches everything.
    pub fn everything() -> LabelSelector {
        LabelSelector::default()
    }

    /// Parses Kubernetes label selector syntax. `""` matches everything.
    pub fn parse(selector: &str) -> Result<LabelSelector, SelectorError> {
        let err = |message: String| SelectorError::InvalidLabelSelector {
            selector: selector.to_string(),
            message,
        };
        let tokens = lex(selector).map_err(err)?;
        let mut p = Parser { tokens, pos: 0 };
        let mut requirements = p.parse().map_err(err)?;
        // Kubernetes sorts requirements by key; keeps Display canonical.
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector { requirements })
    }

    /// Whether the label set satisfies every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// True when the selector has no requirements (matches everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// `(key, value)` for each requirement that pins a key to one value
    /// (`=`, `==`, `in` with a single value): usable for index lookups.
    pub fn exact_pairs(&self) -> Vec<(String, String)> {
        self.requirements
            .iter()
            .filter_map(|r| r.exact_value().map(|v| (r.key.clone(), v.to_string())))
            .collect()
    }

    /// The requirements, sorted by key.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_terms(f, &self.requirements)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok<'a> {
    Ident(&'a str),
    In,
    NotIn,
    Eq,
    DoubleEq,
    NotEq,
    Bang,
    Gt,
    Lt,
    Open,
    Close,
    Comma,
}

impl Tok<'_> {
    fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("'{s}'"),
            Tok::In => "'in'".into(),
            Tok::NotIn => "'notin'".into(),
            Tok::Eq => "'='".into(),
            Tok::DoubleEq => "'=='".into(),
            Tok::NotEq => "'!='".into(),
            Tok::Bang => "'!'".into(),
            Tok::Gt => "'>'".into(),
            Tok::Lt => "'<'".into(),
            Tok::Open => "'('".into(),
            Tok::Close => "')'".into(),
            Tok::Comma => "','".into(),
        }
    }
}

fn describe(t: Option<&Tok<'_>>) -> String {
    // kube's lexer's end-of-string literal is empty: `found ''`.
    t.map_or_else(|| "''".to_string(), Tok::describe)
}

fn is_special(b: u8) -> bool {
    matches!(b, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

/// Splits a label selector into tokens. Identifiers run until whitespace or
/// a special symbol; all split points are ASCII, so slices are valid UTF-8.
fn lex(s: &str) -> Result<Vec<Tok<'_>>, String> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if is_space(c) {
            i += 1;
            continue;
        }
        if is_special(c) {
            let two = b.get(i..i + 2);
            let (tok, n) = match (c, two) {
                (b'=', Some(b"==")) => (Tok::DoubleEq, 2),
                (b'!', Some(b"!=")) => (Tok::NotEq, 2),
                (b'=', _) => (Tok::Eq, 1),
                (b'!', _) => (Tok::Bang, 1),
                (b'(', _) => (Tok::Open, 1),
                (b')', _) => (Tok::Close, 1),
                (b',', _) => (Tok::Comma, 1),
                (b'>', _) => (Tok::Gt, 1),
                (b'<', _) => (Tok::Lt, 1),
                _ => return Err(format!("unexpected character {:?}", c as char)),
            };
            out.push(tok);
            i += n;
            continue;
        }
        let start = i;
        while i < b.len() && !is_space(b[i]) && !is_special(b[i]) {
            i += 1;
        }
        let word = s.get(start..i).ok_or("invalid UTF-8 boundary")?;
        out.push(match word {
            "in" => Tok::In,
            "notin" => Tok::NotIn,
            w => Tok::Ident(w),
        });
    }
    Ok(out)
}

struct Parser<'a> {
    tokens: Vec<Tok<'a>>,
    pos: usize,
}

impl<'a> Parser<'a> {
    /// Next token; in value context the keywords `in`/`notin` are identifiers.
    fn peek_value(&self) -> Option<Tok<'a>> {
        self.tokens.get(self.pos).cloned().map(|t| match t {
            Tok::In => Tok::Ident("in"),
            Tok::NotIn => Tok::Ident("notin"),
            t => t,
        })
    }

    fn next_value(&mut self) -> Option<Tok<'a>> {
        let t = self.peek_value();
        if t.is_some() {
            self.pos += 1;
        }
        t
    }

    fn next_raw(&mut self) -> Option<Tok<'a>> {
        let t = self.tokens.get(self.pos).cloned();
        if t.is_some() {
            self.pos += 1;
        }
        t
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, String> {
        let mut reqs = Vec::new();
        loop {
            match self.peek_value() {
                None => return Ok(reqs),
                Some(Tok::Ident(_) | Tok::Bang) => {
                    reqs.push(
                        self.requirement()
                            .map_err(|e| format!("unable to parse requirement: {e}"))?,
                    );
                    match self.next_value() {
                        None => return Ok(reqs),
                        Some(Tok::Comma) => match self.peek_value() {
                            Some(Tok::Ident(_) | Tok::Bang) => {}
                            t => {
                                return Err(format!(
                                    "found {}, expected: identifier after ','",
                                    describe(t.as_ref())
                                ));
                            }
                        },
                        Some(t) => {
                            return Err(format!(
                                "found {}, expected: ',' or 'end of string'",
                                t.describe()
                            ));
                        }
                    }
                }
                Some(t) => {
                    return Err(format!(
                        "found {}, expected: !, identifier, or 'end of string'",
                        t.describe()
                    ));
                }
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, String> {
        let mut negated = false;
        let mut tok = self.next_value();
        if tok == Some(Tok::Bang) {
            negated = true;
            tok = self.next_value();
        }
        let key = match tok {
            Some(Tok::Ident(k)) => k,
            t => {
                return Err(format!(
                    "found {}, expected: identifier",
                    describe(t.as_ref())
                ));
            }
        };
        validate_label_key(key)?;
        let at_end = matches!(self.peek_value(), None | Some(Tok::Comma));
        if negated {
            return Ok(Requirement {
                key: key.to_string(),
                op: LabelOp::DoesNotExist,
                values: Vec::new(),
            });
        }
        if at_end {
            return Ok(Requirement {
                key: key.to_string(),
                op: LabelOp::Exists,
                values: Vec::new(),
            });
        }
        let op = match self.next_raw() {
            Some(Tok::Eq) => LabelOp::Equals,
            Some(Tok::DoubleEq) => LabelOp::DoubleEquals,
            Some(Tok::NotEq) => LabelOp::NotEquals,
            Some(Tok::In) => LabelOp::In,
            Some(Tok::NotIn) => LabelOp::NotIn,
            Some(Tok::Gt) => LabelOp::GreaterThan,
            Some(Tok::Lt) => LabelOp::LessThan,
            t => {
                return Err(format!(
                    "found {}, expected: in, notin, =, ==, !=, gt, lt",
                    describe(t.as_ref())
                ));
            }
        };
        let mut values = match op {
            LabelOp::In | LabelOp::NotIn => self.value_set()?,
            _ => vec![self.exact_value()?],
        };
        values.sort();
        values.dedup();
        for v in &values {
            validate_label_value(key, v)?;
        }
        if matches!(op, LabelOp::GreaterThan | LabelOp::LessThan) {
            for v in &values {
                if v.parse::<i64>().is_err() {
                    return Err(format!(
                        "for '>', '<' operators, the value must be an integer, got {v:?}"
                    ));
                }
            }
        }
        Ok(Requirement {
            key: key.to_string(),
            op,
            values,
        })
    }

    /// The value after `=`, `==`, `!=`, `>`, `<`; nothing (end or ',') is "".
    fn exact_value(&mut self) -> Result<String, String> {
        match self.peek_value() {
            None | Some(Tok::Comma) => Ok(String::new()),
            Some(Tok::Ident(v)) => {
                self.pos += 1;
                Ok(v.to_string())
            }
            Some(t) => Err(format!("found {}, expected: identifier", t.describe())),
        }
    }

    /// `( v1, v2, ... )`; as in Kubernetes, empty entries are the value "".
    fn value_set(&mut self) -> Result<Vec<String>, String> {
        match self.next_value() {
            Some(Tok::Open) => {}
            t => return Err(format!("found {} expected: '('", describe(t.as_ref()))),
        }
        let mut values = Vec::new();
        // Whether the previous item was a value (so an empty slot is not pending).
        let mut after_value = false;
        loop {
            match self.next_value() {
                Some(Tok::Ident(v)) if !after_value => {
                    values.push(v.to_string());
                    after_value = true;
                }
                Some(Tok::Comma) => {
                    if !after_value {
                        values.push(String::new());
                    }
                    after_value = false;
                }
                Some(Tok::Close) => {
                    if !after_value {
                        values.push(String::new());
                    }
                    return Ok(values);
                }
                t => {
                    return Err(format!(
                        "found {}, expected: ',', ')' or identifier",
                        describe(t.as_ref())
                    ));
                }
            }
        }
    }
}

const QUALIFIED_NAME_MAX: usize = 63;
const LABEL_VALUE_MAX: usize = 63;

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]` (non-empty form).
fn is_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(f), Some(l)) => {
            f.is_ascii_alphanumeric()
                && l.is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// Kubernetes `IsQualifiedName`: `[prefix/]name`.
pub fn validate_label_key(key: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("invalid label key {key:?}: {why}"));
    let (prefix, name) = match key.split_once('/') {
        None => (None, key),
        Some((p, n)) => (Some(p), n),
    };
    if name.contains('/') {
        return bad(
            "a qualified name must consist of an optional DNS subdomain prefix and '/', then a name",
        );
    }
    if let Some(p) = prefix {
        if p.is_empty() {
            return bad("prefix part must be non-empty");
        }
        if let Some(why) = is_dns1123_subdomain(p).first() {
            return bad(&format!("prefix part {why}"));
        }
    }
    if name.is_empty() {
        return bad("name part must be non-empty");
    }
    if name.len() > QUALIFIED_NAME_MAX {
        return bad("name part must be no more than 63 characters");
    }
    if !is_name_part(name) {
        return bad(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
        );
    }
    Ok(())
}

/// Kubernetes `IsValidLabelValue`: empty, or at most 63 characters of
/// alphanumerics, '-', '_', '.', starting and ending alphanumeric.
pub fn validate_label_value(key: &str, value: &str) -> Result<(), String> {
    if value.len() > LABEL_VALUE_MAX {
        return Err(format!(
            "invalid label value {value:?} for key {key:?}: must be no more than 63 characters"
        ));
    }
    if !value.is_empty() && !is_name_part(value) {
        return Err(format!(
            "invalid label value {value:?} for key {key:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Field selectors

/// The operator of a [`FieldRequirement`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldOp {
    /// `f=v`
    Equals,
    /// `f==v`
    DoubleEquals,
    /// `f!=v`
    NotEquals,
}

/// One term of a [`FieldSelector`]; `value` is unescaped.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FieldRequirement {
    pub field: Arc<str>,
    pub op: FieldOp,
    pub value: String,
}

impl FieldRequirement {
    /// Whether the object satisfies this term (missing fields read as "").
    pub fn matches(&self, obj: &Object) -> bool {
        let have = obj.field(&self.field).unwrap_or("");
        match self.op {
            FieldOp::Equals | FieldOp::DoubleEquals => have == self.value,
            FieldOp::NotEquals => have != self.value,
        }
    }
}

impl fmt::Display for FieldRequirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.op {
            FieldOp::Equals => "=",
            FieldOp::DoubleEquals => "==",
            FieldOp::NotEquals => "!=",
        };
        write!(f, "{}{op}{}", self.field, escape_field_value(&self.value))
    }
}

/// A parsed field selector: the AND of its terms.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// The selector that matches everything.
    pub fn everything() -> FieldSelector {
        FieldSelector::default()
    }

    /// Parses `fields.ParseSelector` syntax, accepting `metadata.name`,
    /// `metadata.namespace` and `allowed_paths` (the codec's index paths).
    pub fn parse(
        selector: &str,
        allowed_paths: &[Arc<str>],
    ) -> Result<FieldSelector, SelectorError> {
        let mut requirements = Vec::new();
        for term in split_terms(selector) {
            if term.is_empty() {
                continue;
            }
            let Some((lhs, op, rhs)) = split_term(term) else {
                return Err(SelectorError::InvalidFieldSelector {
                    selector: selector.to_string(),
                    message: format!("invalid selector: '{selector}'; can't understand '{term}'"),
                });
            };
            let value = unescape_field_value(rhs).map_err(|message| {
                SelectorError::InvalidFieldSelector {
                    selector: selector.to_string(),
                    message: format!("invalid field selector: {message}"),
                }
            })?;
            let field: Arc<str> = match lhs {
                FIELD_NAME => Arc::from(FIELD_NAME),
                FIELD_NAMESPACE => Arc::from(FIELD_NAMESPACE),
                _ => match allowed_paths.iter().find(|p| ***p == *lhs) {
                    Some(p) => Arc::clone(p),
                    None => {
                        return Err(SelectorError::FieldNotSupported {
                            field: lhs.to_string(),
                        });
                    }
                },
            };
            requirements.push(FieldRequirement { field, op, value });
        }
        requirements.sort_by(|a, b| a.field.cmp(&b.field));
        Ok(FieldSelector { requirements })
    }

    /// Whether the object satisfies every term.
    pub fn matches(&self, obj: &Object) -> bool {
        self.requirements.iter().all(|r| r.matches(obj))
    }

    /// True when the selector has no terms (matches everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// `(field, value)` of each `=`/`==` term: usable for index lookups.
    pub fn exact_pairs(&self) -> Vec<(String, String)> {
        self.requirements
            .iter()
            .filter(|r| matches!(r.op, FieldOp::Equals | FieldOp::DoubleEquals))
            .map(|r| (r.field.to_string(), r.value.clone()))
            .collect()
    }

    /// The value an `=`/`==` term pins `field` to, if any.
    pub fn exact_value(&self, field: &str) -> Option<&str> {
        self.requirements
            .iter()
            .find(|r| matches!(r.op, FieldOp::Equals | FieldOp::DoubleEquals) && *r.field == *field)
            .map(|r| r.value.as_str())
    }

    /// The terms, sorted by field.
    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.requirements
    }
}

impl fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_terms(f, &self.requirements)
    }
}

/// The value `fieldSelector` pins `metadata.name` to (its first `=` or
/// `==` term on it), read as kube-apiserver's `RequestInfoFactory` does:
/// any field is allowed here, and a selector that does not parse has none.
pub fn exact_name(selector: &str) -> Option<String> {
    let mut name = None;
    for term in split_terms(selector) {
        if term.is_empty() {
            continue;
        }
        let (lhs, op, rhs) = split_term(term)?;
        let value = unescape_field_value(rhs).ok()?;
        if name.is_none() && lhs == FIELD_NAME && op != FieldOp::NotEquals {
            name = Some(value);
        }
    }
    name
}

/// A selector's terms as they are written: comma-separated, in its order.
fn write_terms<T: fmt::Display>(f: &mut fmt::Formatter<'_>, terms: &[T]) -> fmt::Result {
    for (i, t) in terms.iter().enumerate() {
        if i > 0 {
            f.write_str(",")?;
        }
        write!(f, "{t}")?;
    }
    Ok(())
}

/// Splits on commas not preceded by an escaping backslash.
fn split_terms(s: &str) -> Vec<&str> {
    if s.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let mut start = 0;
    let mut in_slash = false;
    for (i, c) in s.char_indices() {
        if in_slash {
            in_slash = false;
        } else if c == '\\' {
            in_slash = true;
        } else if c == ',' {
            terms.push(&s[start..i]);
            start = i + 1;
        }
    }
    terms.push(&s[start..]);
    terms
}

/// The first operator occurrence (`!=`, `==`, `=` tried in that order at each
/// position) splits a term; the left side is not unescaped.
fn split_term(term: &str) -> Option<(&str, FieldOp, &str)> {
    for (i, _) in term.char_indices() {
        let rest = &term[i..];
        for (tok, op) in [
            ("!=", FieldOp::NotEquals),
            ("==", FieldOp::DoubleEquals),
            ("=", FieldOp::Equals),
        ] {
            if let Some(rhs) = rest.strip_prefix(tok) {
                return Some((&term[..i], op, rhs));
            }
        }
    }
    None
}

/// Undoes `\\`, `\,`, `\=`; any other escape, a trailing `\`, or an
/// unescaped `,`/`=` is an error.
fn unescape_field_value(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut in_slash = false;
    for c in s.chars() {
        if in_slash {
            match c {
                '\\' | ',' | '=' => out.push(c),
                _ => return Err(format!("invalid escape sequence: \\{c}")),
            }
            in_slash = false;
            continue;
        }
        match c {
            '\\' => in_slash = true,
            // Go prints the rune as a number: "unescaped character in value: 61".
            ',' | '=' => return Err(format!("unescaped character in value: {}", c as u32)),
            _ => out.push(c),
        }
    }
    if in_slash {
        return Err("invalid escape sequence: \\".into());
    }
    Ok(out)
}

/// Escapes `\`, `,`, `=` for use in a field selector value.
pub fn escape_field_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '\\' | ',' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::ObjectCodec;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn sel(s: &str) -> LabelSelector {
        LabelSelector::parse(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    #[test]
    fn label_empty_matches_everything() {
        for s in ["", " ", "\t\n "] {
            let l = sel(s);
            assert!(l.is_empty());
            assert!(l.matches(&labels(&[])));
            assert!(l.matches(&labels(&[("a", "b")])));
            assert!(l.exact_pairs().is_empty());
        }
        assert!(LabelSelector::everything().is_empty());
    }

    #[test]
    fn label_match_grid() {
        let none = labels(&[]);
        let web = labels(&[("app", "web"), ("tier", "fe"), ("n", "5")]);
        let db = labels(&[("app", "db")]);
        // (selector, matches none, matches web, matches db)
        let grid: &[(&str, bool, bool, bool)] = &[
            ("app=web", false, true, false),
            ("app==web", false, true, false),
            ("app = web", false, true, false),
            ("app!=web", true, false, true),
            ("app in (web,db)", false, true, true),
            ("app in (web)", false, true, false),
            ("app in(web , db )", false, true, true),
            ("app notin (web)", true, false, true),
            ("app notin (web,db)", true, false, false),
            ("app", false, true, true),
            ("!app", true, false, false),
            ("! app", true, false, false),
            ("tier", false, true, false),
            ("!tier", true, false, true),
            ("app=web,tier=fe", false, true, false),
            ("app=web,tier=be", false, false, false),
            ("app,!tier", false, false, true),
            ("app in (web,db),tier notin (be)", false, true, true),
            ("n>4", false, true, false),
            ("n>5", false, false, false),
            ("n<6", false, true, false),
            ("app>1", false, false, false),
            ("app=", false, false, false),
            ("app!=", true, true, true),
            ("app in ()", false, false, false),
            ("app in (,web)", false, true, false),
            ("example.com/app", false, false, false),
            ("in=x", false, false, false),
            ("in,notin", false, false, false),
            ("app=in", false, false, false),
            ("app in (in,notin)", false, false, false),
        ];
        for &(s, m_none, m_web, m_db) in grid {
            let l = sel(s);
            assert_eq!(l.matches(&none), m_none, "{s:?} on {{}}");
            assert_eq!(l.matches(&web), m_web, "{s:?} on web");
            assert_eq!(l.matches(&db), m_db, "{s:?} on db");
            // Display round-trips to an equal selector.
            assert_eq!(sel(&l.to_string()), l, "{s:?} -> {l}");
        }
        // Empty values: `a=` matches a label with the empty value.
        assert!(sel("app=").matches(&labels(&[("app", "")])));
        assert!(sel("app in (x,)").matches(&labels(&[("app", "")])));
    }

    #[test]
    fn label_exact_pairs() {
        let l = sel("b=2,a==1,c in (3),d in (4,5),e!=6,f,!g,h notin (7),i>1");
        assert_eq!(
            l.exact_pairs(),
            [
                ("a".to_string(), "1".to_string()),
                ("b".to_string(), "2".to_string()),
                ("c".to_string(), "3".to_string())
            ]
        );
        assert_eq!(l.requirements().len(), 9);
        assert_eq!(sel("a in (x,x)").exact_pairs(), [("a".into(), "x".into())]);
    }

    #[test]
    fn label_parse_errors() {
        let bad = [
            "a=b,",
            ",a=b",
            "a=b,,c=d",
            "a b",
            "a=b c",
            "a in",
            "a in x",
            "a in (x",
            "a in (x y)",
            "a notin",
            "a=(",
            "a==,",
            "!",
            "!a=b",
            "!a b",
            "=b",
            "(",
            ")",
            "a==b==c",
            "a=b=c",
            "a>b",
            "a<",
            "a>1.5",
            "a=!b",
            "a!b",
            "-a=b",
            "a-=b",
            "a=-b",
            "a=b-",
            "Example.com/a=b",
            "/a=b",
            "a/=b",
            "a/b/c=d",
            "a=b/c",
            "a=名前",
            "名前=a",
            "a=b\\c",
            "a\u{0}=b",
            "a=b;c",
        ];
        for s in bad {
            match LabelSelector::parse(s) {
                Err(SelectorError::InvalidLabelSelector { selector, message }) => {
                    assert_eq!(selector, s);
                    assert!(!message.is_empty());
                }
                other => panic!("{s:?}: want an error, got {other:?}"),
            }
        }
        let long_name = "a".repeat(64);
        let long_value = "v".repeat(64);
        let e = LabelSelector::parse(&format!("{long_name}=x")).unwrap_err();
        assert!(e.to_string().contains("63 characters"), "{e}");
        let e = LabelSelector::parse(&format!("a={long_value}")).unwrap_err();
        assert!(e.to_string().contains("63 characters"), "{e}");
        // Limits are inclusive.
        sel(&format!("{}={}", "a".repeat(63), "v".repeat(63)));
        sel(&format!("{}/a=b", ["x"; 126].join(".")));
        assert!(LabelSelector::parse(&format!("{}/a=b", "x".repeat(254))).is_err());
        sel("example.com/app-name_1.x=Val_1-2.z");
    }

    #[test]
    fn label_fuzz_never_panics() {
        let atoms = [
            "a", "=", "==", "!=", "!", "in", "notin", "(", ")", ",", " ", ">", "<", "b.c/d", "é",
            "\\", "\u{0}", "", "x,", "名",
        ];
        let mut n = 0u32;
        for a in atoms {
            for b in atoms {
                for c in atoms {
                    for d in ["", "1", ")", "(", "名"] {
                        let s = format!("{a}{b}{c}{d}");
                        if let Ok(l) = LabelSelector::parse(&s) {
                            let _ = l.matches(&labels(&[("a", "1"), ("b.c/d", "")]));
                            let _ = l.exact_pairs();
                            // Canonical form parses back to the same selector.
                            assert_eq!(sel(&l.to_string()), l, "{s:?}");
                        }
                        n += 1;
                    }
                }
            }
        }
        assert!(n > 1000);
    }

    fn codec() -> ObjectCodec {
        let r = crate::object::tests::resource(true, &["spec.nodeName", "status.phase"]);
        r.object_codec("/registry")
    }

    fn obj(ns: &str, name: &str, body: &str) -> Object {
        codec()
            .decode(
                &format!("/registry/pods/{ns}/{name}"),
                body.as_bytes(),
                2,
                1,
            )
            .unwrap()
    }

    fn fsel(s: &str) -> FieldSelector {
        FieldSelector::parse(s, codec().index_paths()).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    #[test]
    fn field_match_grid() {
        let scheduled = obj(
            "default",
            "a",
            r#"{"spec":{"nodeName":"n1"},"status":{"phase":"Running"}}"#,
        );
        let pending = obj("kube-system", "b", r#"{"spec":{}}"#);
        let odd = obj("x", "c", r#"{"spec":{"nodeName":"a,b=c\\d"}}"#);
        // (selector, scheduled, pending, odd)
        let grid: &[(&str, bool, bool, bool)] = &[
            ("", true, true, true),
            ("metadata.name=a", true, false, false),
            ("metadata.name==a", true, false, false),
            ("metadata.name!=a", false, true, true),
            ("metadata.namespace=default", true, false, false),
            ("metadata.namespace!=default", false, true, true),
            ("spec.nodeName=n1", true, false, false),
            ("spec.nodeName=", false, true, false),
            ("spec.nodeName!=", true, false, true),
            ("spec.nodeName==", false, true, false),
            ("status.phase=Running,spec.nodeName=n1", true, false, false),
            ("status.phase=Running,metadata.name=b", false, false, false),
            ("status.phase!=Running", false, true, true),
            ("spec.nodeName=a\\,b\\=c\\\\d", false, false, true),
            ("metadata.name=a,", true, false, false),
            (",,metadata.name=a", true, false, false),
        ];
        for &(s, a, b, c) in grid {
            let f = fsel(s);
            assert_eq!(f.matches(&scheduled), a, "{s:?} on scheduled");
            assert_eq!(f.matches(&pending), b, "{s:?} on pending");
            assert_eq!(f.matches(&odd), c, "{s:?} on odd");
            assert_eq!(fsel(&f.to_string()), f, "{s:?} -> {f}");
        }
        assert!(fsel("").is_empty());
        assert!(FieldSelector::everything().is_empty());
        assert!(!fsel("metadata.name=a").is_empty());
    }

    #[test]
    fn field_exact_pairs() {
        let f = fsel("spec.nodeName=n1,metadata.name!=x,metadata.namespace==ns,status.phase=");
        assert_eq!(
            f.exact_pairs(),
            [
                ("metadata.namespace".to_string(), "ns".to_string()),
                ("spec.nodeName".to_string(), "n1".to_string()),
                ("status.phase".to_string(), String::new()),
            ]
        );
        assert_eq!(f.exact_value("spec.nodeName"), Some("n1"));
        assert_eq!(f.exact_value("metadata.name"), None);
        assert_eq!(f.requirements().len(), 4);
        assert_eq!(
            fsel("spec.nodeName=a\\,b").exact_pairs(),
            [("spec.nodeName".to_string(), "a,b".to_string())]
        );
    }

    #[test]
    fn field_errors() {
        let paths = codec().index_paths().to_vec();
        for (s, field) in [
            ("spec.other=x", "spec.other"),
            ("=x", ""),
            ("metadata.name =x", "metadata.name "),
            ("metadata.labels=x", "metadata.labels"),
            ("metadata.name=a,status.hostIP=1", "status.hostIP"),
        ] {
            let e = FieldSelector::parse(s, &paths).unwrap_err();
            assert_eq!(
                e,
                SelectorError::FieldNotSupported {
                    field: field.into()
                },
                "{s:?}"
            );
            assert_eq!(e.to_string(), format!("field label not supported: {field}"));
        }
        for s in [
            "metadata.name",
            "metadata.name=a,b",
            "metadata.name=a=b",
            "metadata.name=a\\",
            "metadata.name=a\\x",
            "metadata.name==a=b",
            "x",
        ] {
            assert!(
                matches!(
                    FieldSelector::parse(s, &paths),
                    Err(SelectorError::InvalidFieldSelector { .. })
                ),
                "{s:?}: {:?}",
                FieldSelector::parse(s, &paths)
            );
        }
        // Without configured paths only metadata.* is allowed.
        assert!(FieldSelector::parse("spec.nodeName=x", &[]).is_err());
        assert!(FieldSelector::parse("metadata.namespace=x", &[]).is_ok());
    }

    #[test]
    fn field_escape_roundtrip_and_fuzz() {
        for v in ["", "a", "a,b", "a=b", "\\", "\\,=", "名前", "a\\\\,"] {
            let s = format!("metadata.name={}", escape_field_value(v));
            assert_eq!(fsel(&s).exact_value("metadata.name"), Some(v), "{s:?}");
        }
        let o = obj("n", "a", "{}");
        let atoms = [
            "metadata.name",
            "=",
            "==",
            "!=",
            "!",
            ",",
            "\\",
            "a",
            "é",
            "",
            "\u{0}",
        ];
        let paths = codec().index_paths().to_vec();
        for a in atoms {
            for b in atoms {
                for c in atoms {
                    for d in atoms {
                        let s = format!("{a}{b}{c}{d}");
                        if let Ok(f) = FieldSelector::parse(&s, &paths) {
                            let _ = f.matches(&o);
                            let _ = f.exact_pairs();
                            assert_eq!(fsel(&f.to_string()), f, "{s:?}");
                        }
                    }
                }
            }
        }
    }
}
