//! Keeps `docs/ARCHITECTURE.md` and the module layering honest, without
//! building or running anything (no etcd):
//! - every `.rs` file under `src/` is named in the doc by its path relative
//!   to `src/` (`api/handlers/get.rs`), and every `.rs` path the doc names
//!   exists;
//! - no import goes round in a circle between modules of `src/`, at any
//!   depth: between top-level modules (`api`, `auth`, `tls`), between the
//!   modules inside them (`api/handlers`, `api/response`), and between files.
//!
//! Imports are read from the source text: `use` trees and paths written
//! inline (`crate::tls::crypto_provider()`), starting with `crate`, `super`,
//! `self` or a child module's name. Each resolves to the deepest file it
//! names (`crate::api::response::body::Body` -> `api/response/body.rs`).
//! Test-only code (`#[cfg(test)]` items) is left out: a test may drive a
//! layer from above. A module's own submodules are part of it: `mod.rs` declaring and
//! re-exporting them is no import, but a child importing its parent is.
//! `src/main.rs` is the binary's root: it imports the library by name, and
//! nothing can import it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `src/`, relative to it, with `/` separators.
fn src_files() -> Vec<String> {
    fn walk(dir: &Path, base: &Path, out: &mut Vec<String>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .filter_map(Result::ok)
            .map(|e| e.path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, base, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(base).unwrap_or(&p);
                let parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                out.push(parts.join("/"));
            }
        }
    }
    let src = root().join("src");
    let mut out = Vec::new();
    walk(&src, &src, &mut out);
    out
}

/// The `.rs` paths a text names: runs of path characters ending in `.rs`.
fn rs_paths(text: &str) -> BTreeSet<String> {
    let is_path = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '/' | '.' | '-');
    let mut out = BTreeSet::new();
    for token in text.split(|c: char| !is_path(c)) {
        let token = token.trim_end_matches('.');
        if let Some(stem) = token.strip_suffix(".rs")
            && !stem.is_empty()
            && !stem.ends_with('/')
        {
            out.insert(token.to_string());
        }
    }
    out
}

#[test]
fn architecture_doc_names_every_source_file() {
    let doc_path = root().join("docs/ARCHITECTURE.md");
    let doc = std::fs::read_to_string(&doc_path)
        .unwrap_or_else(|e| panic!("{}: {e}", doc_path.display()));
    let named = rs_paths(&doc);
    let files = src_files();
    let missing: Vec<&String> = files.iter().filter(|f| !named.contains(*f)).collect();
    // A path the doc names is a file of src/ (`api/state.rs`) or of the
    // repository (`tests/architecture.rs`, `src/lib.rs`).
    let stale: Vec<&String> = named
        .iter()
        .filter(|p| !root().join("src").join(p).is_file() && !root().join(p).is_file())
        .collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "docs/ARCHITECTURE.md is out of date.\n  source files it does not name: {missing:?}\n  paths it names that do not exist: {stale:?}"
    );
}

/// A file's module path: `api/handlers/get.rs` -> `[api, handlers, get]`,
/// `api/mod.rs` -> `[api]`, `lib.rs` -> `[]`.
fn module_of(file: &str) -> Vec<String> {
    let mut parts: Vec<String> = file.split('/').map(str::to_string).collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if !(stem == "mod" || (parts.is_empty() && stem == "lib")) {
        parts.push(stem.to_string());
    }
    parts
}

/// Source files by module path.
struct Modules(BTreeMap<Vec<String>, String>);

impl Modules {
    /// The file of the deepest module `path` names (an item's path names
    /// its module, then the item).
    fn resolve(&self, path: &[String]) -> Option<&String> {
        (0..=path.len())
            .rev()
            .find_map(|n| self.0.get(path.get(..n).unwrap_or_default()))
    }

    fn has_child(&self, module: &[String], name: &str) -> bool {
        let mut p = module.to_vec();
        p.push(name.to_string());
        self.0.contains_key(&p)
    }
}

/// `text` without comments (`//` to the end of a line, outside strings) and
/// without the contents of string literals.
fn code_of(line: &str) -> String {
    // A quote in a char literal opens no string.
    let line = line.replace(r#"'\"'"#, "' '").replace(r#"'"'"#, "' '");
    let mut out = String::with_capacity(line.len());
    let mut in_str = false;
    let mut prev = ' ';
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if in_str {
            if c == '"' && prev != '\\' {
                in_str = false;
                out.push('"');
            }
            prev = if c == '\\' && prev == '\\' { ' ' } else { c };
            continue;
        }
        if c == '/' && chars.peek() == Some(&'/') {
            break;
        }
        if c == '"' {
            in_str = true;
        }
        out.push(c);
        prev = c;
    }
    out
}

/// The paths of a `use` tree (`a::{b, c::{self, d}}`), each as segments.
fn expand_use(tree: &str) -> Vec<Vec<String>> {
    fn split_top(s: &str) -> Vec<&str> {
        let (mut depth, mut start, mut out) = (0, 0, Vec::new());
        for (i, c) in s.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(&s[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        out.push(&s[start..]);
        out
    }
    fn go(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
        let tree = tree.trim();
        if tree.is_empty() {
            return;
        }
        if let Some(open) = tree.find('{') {
            let head = tree[..open].trim().trim_end_matches("::");
            let inner = tree[open + 1..].trim_end().trim_end_matches('}');
            let mut p = prefix.to_vec();
            p.extend(
                head.split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_string),
            );
            for part in split_top(inner) {
                go(&p, part, out);
            }
            return;
        }
        let tree = tree.split(" as ").next().unwrap_or(tree).trim();
        let mut p = prefix.to_vec();
        for seg in tree.split("::").filter(|s| !s.is_empty()) {
            if seg == "self" && !p.is_empty() {
                continue;
            }
            p.push(seg.to_string());
        }
        out.push(p);
    }
    let mut out = Vec::new();
    go(&[], tree, &mut out);
    out
}

/// Absolute module path of `path` written in module `here`, if it is a path
/// into this crate.
fn absolute(modules: &Modules, here: &[String], path: &[String]) -> Option<Vec<String>> {
    let first = path.first()?;
    let mut base: Vec<String> = match first.as_str() {
        "crate" => Vec::new(),
        "self" => here.to_vec(),
        "super" => {
            let mut b = here.to_vec();
            let mut rest = path;
            while rest.first().is_some_and(|s| s == "super") {
                b.pop();
                rest = &rest[1..];
            }
            b.extend(rest.iter().cloned());
            return Some(b);
        }
        name if modules.has_child(here, name) => {
            let mut b = here.to_vec();
            b.push(name.to_string());
            b
        }
        _ => return None,
    };
    base.extend(path.iter().skip(1).cloned());
    Some(base)
}

/// Whether an import of `dep` from module `module` counts: not the file
/// itself, nor a module inside it (a parent holds its children: `mod.rs`
/// declaring and re-exporting them is not an import). A child importing
/// its parent does count.
fn counts(module: &[String], dep: &str) -> bool {
    let target = module_of(dep);
    !target.starts_with(module)
}

/// Modules declared test-only in their parent's file (`#[cfg(test)]` then
/// `mod tests;`): helpers for tests, which may reach any layer.
fn test_only_modules(modules: &Modules) -> BTreeSet<Vec<String>> {
    let src = root().join("src");
    let mut out = BTreeSet::new();
    for (module, file) in &modules.0 {
        let text = std::fs::read_to_string(src.join(file)).unwrap_or_default();
        let mut test_attr = false;
        for raw in text.lines() {
            let trimmed = code_of(raw).trim().to_string();
            if trimmed == "#[cfg(test)]" {
                test_attr = true;
                continue;
            }
            if test_attr && !trimmed.starts_with("#[") && !trimmed.is_empty() {
                test_attr = false;
                let words: Vec<&str> = trimmed.split_whitespace().collect();
                if let Some(i) = words.iter().position(|w| *w == "mod")
                    && let Some(name) = words.get(i + 1)
                    && trimmed.ends_with(';')
                {
                    let mut child = module.clone();
                    child.push(name.trim_end_matches(';').to_string());
                    out.insert(child);
                }
            }
        }
    }
    out
}

/// The files each file imports from (itself and its own submodules left
/// out, see [`counts`]; test-only modules left out, see
/// [`test_only_modules`]).
fn imports(modules: &Modules) -> BTreeMap<String, BTreeSet<String>> {
    let src = root().join("src");
    let test_only = test_only_modules(modules);
    let mut graph = BTreeMap::new();
    for (module, file) in &modules.0 {
        if file == "main.rs" || test_only.contains(module) {
            continue;
        }
        let text = std::fs::read_to_string(src.join(file)).unwrap_or_default();
        let mut deps = BTreeSet::new();
        // Inline modules (`mod tests {`), by indentation: rustfmt'd code
        // closes one with `}` at the indentation that opened it.
        let mut inline: Vec<(usize, String)> = Vec::new();
        let mut pending_use: Option<String> = None;
        // Test-only code (`#[cfg(test)]` and the item after it) may reach
        // any module, as a test of a layer uses the ones above to drive it.
        let mut test_attr = false;
        let mut test_item: Option<usize> = None;
        for raw in text.lines() {
            let code = code_of(raw);
            let trimmed = code.trim();
            let indent = code.len() - code.trim_start().len();
            if let Some(i) = test_item {
                if indent == i && trimmed.starts_with('}') {
                    test_item = None;
                }
                continue;
            }
            if trimmed == "#[cfg(test)]" {
                test_attr = true;
                continue;
            }
            if test_attr && !trimmed.starts_with("#[") && !trimmed.is_empty() {
                test_attr = false;
                if trimmed.ends_with('{') {
                    test_item = Some(indent);
                }
                continue;
            }
            if let Some((i, _)) = inline.last()
                && *i == indent
                && trimmed == "}"
            {
                inline.pop();
                continue;
            }
            let here: Vec<String> = module
                .iter()
                .cloned()
                .chain(inline.iter().map(|(_, n)| n.clone()))
                .collect();
            let words: Vec<&str> = trimmed.split_whitespace().collect();
            let after_vis = words
                .iter()
                .position(|w| !w.starts_with("pub"))
                .unwrap_or(words.len());
            if words.get(after_vis) == Some(&"mod") && trimmed.ends_with('{') {
                if let Some(name) = words.get(after_vis + 1) {
                    inline.push((indent, name.trim_end_matches('{').to_string()));
                }
                continue;
            }
            let mut paths: Vec<Vec<String>> = Vec::new();
            let use_start = (words.get(after_vis) == Some(&"use")).then(|| {
                let at = code.find("use ").unwrap_or(0);
                code[at + 4..].to_string()
            });
            if let Some(start) = use_start.or_else(|| pending_use.take().map(|p| p + &code)) {
                match start.find(';') {
                    Some(end) => paths.extend(expand_use(&start[..end])),
                    None => pending_use = Some(start),
                }
                for p in paths {
                    if let Some(abs) = absolute(modules, &here, &p)
                        && let Some(dep) = modules.resolve(&abs)
                        && counts(module, dep)
                    {
                        deps.insert(dep.clone());
                    }
                }
                continue;
            }
            for p in inline_paths(&code) {
                if let Some(abs) = absolute(modules, &here, &p)
                    && let Some(dep) = modules.resolve(&abs)
                    && counts(module, dep)
                {
                    deps.insert(dep.clone());
                }
            }
        }
        graph.insert(file.clone(), deps);
    }
    graph
}

/// Paths written in code: `a::b::c` runs not preceded by `::` (an
/// absolute path like `::json_patch::merge` names another crate).
fn inline_paths(code: &str) -> Vec<Vec<String>> {
    let bytes = code.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if !ident(bytes[i]) || (i > 0 && (ident(bytes[i - 1]) || bytes[i - 1] == b':')) {
            i += 1;
            continue;
        }
        let mut segs = Vec::new();
        let mut j = i;
        loop {
            let s = j;
            while j < bytes.len() && ident(bytes[j]) {
                j += 1;
            }
            segs.push(code[s..j].to_string());
            if code[j..].starts_with("::") && bytes.get(j + 2).is_some_and(|b| ident(*b)) {
                j += 2;
            } else {
                break;
            }
        }
        if segs.len() > 1 {
            out.push(segs);
        }
        i = j.max(i + 1);
    }
    out
}

/// A cycle in `graph`, as its nodes in order, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        marks.insert(n.to_string(), Mark::Open);
        stack.push(n.to_string());
        for m in graph.get(n).into_iter().flatten() {
            match marks.get(m).copied().unwrap_or(Mark::New) {
                Mark::Open => {
                    let at = stack.iter().position(|s| s == m).unwrap_or(0);
                    let mut cycle = stack[at..].to_vec();
                    cycle.push(m.clone());
                    return Some(cycle);
                }
                Mark::New => {
                    if let Some(c) = visit(m, graph, marks, stack) {
                        return Some(c);
                    }
                }
                Mark::Done => {}
            }
        }
        stack.pop();
        marks.insert(n.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for n in graph.keys() {
        if marks.get(n).copied().unwrap_or(Mark::New) == Mark::New {
            let mut stack = Vec::new();
            if let Some(c) = visit(n, graph, &mut marks, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

/// The strongly connected sets of more than one node (Kosaraju).
fn knots(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    fn order(
        n: &String,
        g: &BTreeMap<String, BTreeSet<String>>,
        seen: &mut BTreeSet<String>,
        out: &mut Vec<String>,
    ) {
        if !seen.insert(n.clone()) {
            return;
        }
        for m in g.get(n).into_iter().flatten() {
            order(m, g, seen, out);
        }
        out.push(n.clone());
    }
    let mut reverse: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, tos) in graph {
        for to in tos {
            reverse.entry(to.clone()).or_default().insert(from.clone());
        }
    }
    let (mut seen, mut finished) = (BTreeSet::new(), Vec::new());
    for n in graph.keys() {
        order(n, graph, &mut seen, &mut finished);
    }
    let mut assigned = BTreeSet::new();
    let mut out = Vec::new();
    for n in finished.iter().rev() {
        if assigned.contains(n) {
            continue;
        }
        let mut members = Vec::new();
        order(n, &reverse, &mut assigned, &mut members);
        if members.len() > 1 {
            out.push(members.into_iter().collect());
        }
    }
    out
}

#[test]
fn no_import_circles_between_modules() {
    let modules = Modules(
        src_files()
            .into_iter()
            .map(|f| (module_of(&f), f))
            .collect(),
    );
    let files = imports(&modules);
    let depth = modules.0.keys().map(Vec::len).max().unwrap_or(0);
    let mut circles = Vec::new();
    // Depth 1: top-level modules; deeper: the modules inside them; the
    // deepest: files. A module's label is its path cut to the depth.
    for d in 1..=depth {
        let label = |file: &String| {
            let m = module_of(file);
            m.get(..d.min(m.len())).unwrap_or_default().join("/")
        };
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, tos) in &files {
            let entry = graph.entry(label(from)).or_default();
            for to in tos {
                if label(to) != label(from) {
                    entry.insert(label(to));
                }
            }
        }
        // One circle per knot of modules that reach each other.
        for knot in knots(&graph) {
            let sub: BTreeMap<String, BTreeSet<String>> = knot
                .iter()
                .map(|n| {
                    let tos = graph.get(n).into_iter().flatten();
                    (
                        n.clone(),
                        tos.filter(|t| knot.contains(*t)).cloned().collect(),
                    )
                })
                .collect();
            if let Some(c) = find_cycle(&sub) {
                circles.push(format!("depth {d}: {}", c.join(" -> ")));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "import circles in src/ (each module may import only from modules below it):\n  {}",
        circles.join("\n  ")
    );
}

/// The checker itself: a use tree, inline paths and a circle.
#[test]
fn the_checker_reads_use_trees_and_finds_circles() {
    assert_eq!(
        expand_use("super::{a::{self, B}, c::D as E}"),
        vec![
            vec!["super", "a"],
            vec!["super", "a", "B"],
            vec!["super", "c", "D"],
        ]
    );
    assert_eq!(
        inline_paths("let p = crate::tls::crypto_provider(); ::json_patch::merge(x)"),
        vec![vec!["crate", "tls", "crypto_provider"]]
    );
    assert_eq!(
        code_of(r#"let s = "a // b"; // crate::x"#),
        r#"let s = ""; "#
    );
    assert_eq!(
        code_of(r#"c == '"' && crate::x::y()"#),
        r#"c == ' ' && crate::x::y()"#
    );
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(str::to_string).collect()))
    .collect();
    assert_eq!(
        find_cycle(&g),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    let mut acyclic = g.clone();
    acyclic.insert("c".into(), BTreeSet::new());
    assert_eq!(find_cycle(&acyclic), None);
}
