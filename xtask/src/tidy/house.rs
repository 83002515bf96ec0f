//! The house inside each crate: how long its files are, how its modules
//! import each other, and whether they keep the order docs/architecture.md
//! declares for them (the grammar is in `tidy.rs`'s doc comment).
//!
//! Everything here reads text, never the compiler: a crate is a map from
//! paths under its `src/` to their contents, so the tests build small trees
//! in memory.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

/// The most lines a source file of `crates/*/src` may have.
pub const MAX_LINES: usize = 400;

/// One problem, and the path it is about (`crates/<name>/src...` or
/// `docs/architecture.md`), which the allow-list matches against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub at: String,
    pub what: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.at, self.what)
    }
}

/// A crate's sources: each `.rs` file under its `src/`, by its path
/// relative to `src/` (`pool.rs`, `hub/task.rs`).
#[derive(Debug, Default)]
pub struct Sources {
    /// The crate's folder under `crates/`, as an order names it.
    pub name: String,
    pub files: BTreeMap<String, String>,
}

impl Sources {
    /// Reads `crates/<name>/src` under `root`.
    pub fn read(root: &Path, name: &str) -> Result<Sources, String> {
        let src = root.join("crates").join(name).join("src");
        let mut files = BTreeMap::new();
        let mut dirs = vec![src.clone()];
        while let Some(dir) = dirs.pop() {
            let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let rel = path.strip_prefix(&src).unwrap_or(&path).to_string_lossy().replace('\\', "/");
                    let text =
                        std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                    files.insert(rel, text);
                }
            }
        }
        Ok(Sources { name: name.to_owned(), files })
    }

    /// Where a finding in file `rel` (or the crate, when empty) is reported.
    fn at(&self, rel: &str) -> String {
        if rel.is_empty() {
            format!("crates/{}/src", self.name)
        } else {
            format!("crates/{}/src/{rel}", self.name)
        }
    }
}

/// Each file over [`MAX_LINES`] lines, with its count.
pub fn long_files(src: &Sources) -> Vec<Problem> {
    src.files
        .iter()
        .filter_map(|(rel, text)| {
            let lines = text.lines().count();
            (lines > MAX_LINES)
                .then(|| Problem { at: src.at(rel), what: format!("{lines} lines, over {MAX_LINES}") })
        })
        .collect()
}

/// The module path of a file's top: `[]` for the crate root (`lib.rs`,
/// `main.rs`), `[foo]` for `foo.rs` or `foo/mod.rs`, `[foo, bar]` for
/// `foo/bar.rs`.
fn module_path(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel.trim_end_matches(".rs").split('/').map(str::to_owned).collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        parts.clear();
    }
    parts
}

/// A crate's modules and the imports between them.
#[derive(Debug, Default)]
pub struct Graph {
    /// The top-level modules: each file or folder of `src/` but the root.
    pub modules: BTreeSet<String>,
    /// `(importer, imported)`, with the first place it happens (`file:line`).
    pub edges: BTreeMap<(String, String), String>,
}

/// Reads the imports of every file but the root's. Module A imports B when
/// a file of A names `crate::B` (or `$crate::B`, or `B` inside a
/// `crate::{...}` group), a name the root brings in from B (`crate::Name`
/// where the root has `pub use B::...::Name`), or reaches the root through
/// `super::` and goes on to B. Comments and literals are skipped; inline
/// `mod name { ... }` blocks count for `super::`.
pub fn graph(src: &Sources) -> Graph {
    let modules: BTreeSet<String> =
        src.files.keys().map(|rel| module_path(rel)).filter_map(|p| p.into_iter().next()).collect();
    let mut root_names = BTreeMap::new();
    for (rel, text) in &src.files {
        if module_path(rel).is_empty() {
            root_names.extend(root_imports(&tokens(&strip(text)), &modules));
        }
    }
    let resolve = |name: &str| -> Option<String> {
        if modules.contains(name) {
            Some(name.to_owned())
        } else {
            root_names.get(name).cloned()
        }
    };
    let mut edges = BTreeMap::new();
    for (rel, text) in &src.files {
        let path = module_path(rel);
        let Some(from) = path.first().cloned() else { continue };
        let toks = tokens(&strip(text));
        let mut depth = 0usize;
        // Inline modules open at this point, with the depth of their body.
        let mut inline: Vec<(String, usize)> = Vec::new();
        let text_at = |i: usize| toks.get(i).map(|t| t.text.as_str()).unwrap_or("");
        let mut i = 0;
        while i < toks.len() {
            let here = text_at(i);
            let after_path = i > 0 && text_at(i - 1) == "::";
            let mut targets = Vec::new();
            match here {
                "{" => depth += 1,
                "}" => {
                    if inline.last().is_some_and(|(_, d)| *d == depth) {
                        inline.pop();
                    }
                    depth = depth.saturating_sub(1);
                }
                "mod" if is_ident(text_at(i + 1)) && text_at(i + 2) == "{" => {
                    inline.push((text_at(i + 1).to_owned(), depth + 1));
                }
                "crate" if !after_path && text_at(i + 1) == "::" => {
                    targets = first_segments(&toks, i + 2).iter().filter_map(|s| resolve(s)).collect();
                }
                "super" if !after_path && text_at(i + 1) == "::" => {
                    let mut j = i;
                    let mut ups = 0;
                    while text_at(j) == "super" && text_at(j + 1) == "::" {
                        ups += 1;
                        j += 2;
                    }
                    let mut at: Vec<String> = path.clone();
                    at.extend(inline.iter().map(|(name, _)| name.clone()));
                    if ups < at.len() {
                        // Still inside this module.
                    } else if ups == at.len() {
                        targets = first_segments(&toks, j).iter().filter_map(|s| resolve(s)).collect();
                    }
                    i = j.saturating_sub(1);
                }
                _ => {}
            }
            let line = toks.get(i).map_or(0, |t| t.line);
            for to in targets.into_iter().filter(|t| *t != from) {
                edges.entry((from.clone(), to)).or_insert_with(|| format!("{rel}:{line}"));
            }
            i += 1;
        }
    }
    Graph { modules, edges }
}

/// The first segment of the path starting at token `at`: one name, or
/// the first name of each member of a `{...}` group.
fn first_segments(toks: &[Token], at: usize) -> Vec<String> {
    let text_at = |i: usize| toks.get(i).map(|t| t.text.as_str()).unwrap_or("");
    if is_ident(text_at(at)) {
        return vec![text_at(at).to_owned()];
    }
    if text_at(at) != "{" {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut depth = 0;
    let mut expect_name = true;
    for t in &toks[at..] {
        match t.text.as_str() {
            "{" => {
                depth += 1;
                expect_name = depth == 1;
            }
            "}" => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            "," => expect_name = depth == 1,
            name if expect_name && is_ident(name) => {
                out.push(name.to_owned());
                expect_name = false;
            }
            _ => expect_name = false,
        }
    }
    out
}

/// The names the root brings in from a module (`pub use pool::PgPool;`,
/// `use config::{A, B as C};`), as name -> module.
fn root_imports(toks: &[Token], modules: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (i, t) in toks.iter().enumerate() {
        if t.text != "use" {
            continue;
        }
        let mut leaves = Vec::new();
        let mut at = i + 1;
        use_tree(toks, &mut at, None, &mut leaves);
        for (module, name) in leaves {
            if modules.contains(&module) {
                out.insert(name, module);
            }
        }
    }
    out
}

/// Parses one use tree from `toks[*at]`, pushing (first segment, name
/// bound) for each leaf. Leading `crate`, `self` and `::` are skipped.
fn use_tree(toks: &[Token], at: &mut usize, first: Option<String>, out: &mut Vec<(String, String)>) {
    let text_at = |i: usize| toks.get(i).map(|t| t.text.as_str()).unwrap_or("");
    let mut first = first;
    loop {
        match text_at(*at) {
            "{" => {
                *at += 1;
                loop {
                    if text_at(*at) == "}" {
                        *at += 1;
                        return;
                    }
                    use_tree(toks, at, first.clone(), out);
                    match text_at(*at) {
                        "," => *at += 1,
                        "}" => {
                            *at += 1;
                            return;
                        }
                        _ => return,
                    }
                }
            }
            "::" => *at += 1,
            name if is_ident(name) => {
                *at += 1;
                if first.is_none() && (name == "crate" || name == "self") {
                    continue;
                }
                let first = first.get_or_insert_with(|| name.to_owned()).clone();
                match text_at(*at) {
                    "::" => *at += 1,
                    "as" => {
                        out.push((first, text_at(*at + 1).to_owned()));
                        *at += 2;
                        return;
                    }
                    _ => {
                        out.push((first, name.to_owned()));
                        return;
                    }
                }
            }
            _ => return,
        }
    }
}

/// Every circle of imports: each set of modules that reach each other
/// (a strongly connected component of more than one), with the imports
/// that close it, so that each cycle's steps are named.
pub fn cycles(src: &Sources, graph: &Graph) -> Vec<Problem> {
    let mut problems = Vec::new();
    for component in components(graph) {
        let steps: Vec<String> = graph
            .edges
            .iter()
            .filter(|((a, b), _)| component.contains(a) && component.contains(b))
            .map(|((a, b), site)| format!("{a} -> {b} ({site})"))
            .collect();
        let members: Vec<&str> = component.iter().map(String::as_str).collect();
        problems.push(Problem {
            at: src.at(""),
            what: format!("a circle of imports among {}: {}", members.join(", "), steps.join(", ")),
        });
    }
    problems
}

/// The strongly connected components of more than one module (Tarjan).
fn components(graph: &Graph) -> Vec<BTreeSet<String>> {
    struct Walk<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        found: Vec<BTreeSet<String>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, v: &'g str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            let next: Vec<&'g str> =
                self.graph.edges.keys().filter(|(a, _)| a == v).map(|(_, b)| b.as_str()).collect();
            for w in next {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = BTreeSet::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.insert(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for m in &graph.modules {
        if !walk.index.contains_key(m.as_str()) {
            walk.visit(m);
        }
    }
    walk.found.sort();
    walk.found
}

/// A crate's module order as docs/architecture.md declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Order {
    /// The crate's folder under `crates/`.
    pub krate: String,
    /// The levels, lowest first; the modules of one level.
    pub levels: Vec<Vec<String>>,
    /// The line of the block's header in the doc.
    pub line: usize,
}

/// Every order block of `doc` (see the grammar in `tidy.rs`), and the
/// problems of those that do not parse, reported at `doc_path:line`.
pub fn orders(doc: &str, doc_path: &str) -> (Vec<Order>, Vec<Problem>) {
    let lines: Vec<&str> = doc.lines().collect();
    let (mut found, mut problems) = (Vec::new(), Vec::new());
    let mut n = 0;
    while n + 1 < lines.len() {
        let header = lines[n + 1].trim();
        let Some(krate) = header.strip_suffix(" modules, lowest first:") else {
            n += 1;
            continue;
        };
        if lines[n].trim() != "```text" {
            n += 1;
            continue;
        }
        let line = n + 2;
        let body: Vec<&str> =
            lines[n + 2..].iter().take_while(|l| l.trim() != "```").map(|l| l.trim()).collect();
        n += 2 + body.len();
        let mut bad = |why: String| {
            problems
                .push(Problem { at: format!("{doc_path}:{line}"), what: format!("the {krate} order: {why}") })
        };
        if !is_name(krate) {
            bad(format!("{krate:?} is not a crate folder's name"));
            continue;
        }
        let chain = body.join(" ");
        if chain.trim().is_empty() {
            bad("lists no module".to_owned());
            continue;
        }
        let levels: Vec<Vec<String>> =
            chain.split("->").map(|level| level.split(',').map(|m| m.trim().to_owned()).collect()).collect();
        let wrong: Vec<&String> = levels.iter().flatten().filter(|m| !is_name(m)).collect();
        if !wrong.is_empty() {
            bad(format!("{wrong:?} are not module names (levels are `a, b -> c`)"));
            continue;
        }
        found.push(Order { krate: krate.to_owned(), levels, line });
    }
    (found, problems)
}

/// What breaks `order` in `src`: modules listed twice, listed but not in
/// the crate, in the crate but not listed, and each import of a module
/// listed at its importer's level or after it.
pub fn order_problems(order: &Order, src: &Sources, graph: &Graph) -> Vec<Problem> {
    let mut problems = Vec::new();
    let whole = src.at("");
    let mut level = BTreeMap::new();
    for (n, names) in order.levels.iter().enumerate() {
        for name in names {
            if level.insert(name.as_str(), n).is_some() {
                problems.push(Problem {
                    at: whole.clone(),
                    what: format!("docs/architecture.md's {} order lists {name} twice", order.krate),
                });
            }
        }
    }
    let unknown: Vec<&str> = level.keys().copied().filter(|m| !graph.modules.contains(*m)).collect();
    if !unknown.is_empty() {
        problems.push(Problem {
            at: whole.clone(),
            what: format!(
                "docs/architecture.md's {} order lists {}, not modules of this crate",
                order.krate,
                unknown.join(", ")
            ),
        });
    }
    let missing: Vec<&str> =
        graph.modules.iter().map(String::as_str).filter(|m| !level.contains_key(m)).collect();
    if !missing.is_empty() {
        problems.push(Problem {
            at: whole,
            what: format!(
                "docs/architecture.md's {} order does not list {}",
                order.krate,
                missing.join(", ")
            ),
        });
    }
    for ((from, to), site) in &graph.edges {
        let (Some(&a), Some(&b)) = (level.get(from.as_str()), level.get(to.as_str())) else { continue };
        if b < a {
            continue;
        }
        let place = if a == b { "at its own level" } else { "after it" };
        problems.push(Problem {
            at: format!("crates/{}/src/{site}", src.name),
            what: format!(
                "{from} imports {to}, which docs/architecture.md's {} order lists {place} \
                 (a module may import only modules listed before it)",
                order.krate
            ),
        });
    }
    problems
}

fn is_ident(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// A crate folder's or a module's name.
fn is_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// One token of stripped source: a name, `::`, or one other character.
#[derive(Debug)]
struct Token {
    text: String,
    line: usize,
}

fn tokens(code: &str) -> Vec<Token> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Token { text: chars[start..i].iter().collect(), line });
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push(Token { text: "::".to_owned(), line });
            i += 2;
        } else {
            out.push(Token { text: c.to_string(), line });
            i += 1;
        }
    }
    out
}

/// `source` with its comments and its string and character literals
/// blanked out, line breaks kept.
fn strip(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let in_word = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() {
                let d = chars[i];
                i += 1;
                out.push(blank(d));
                if d == '\\' {
                    if let Some(&e) = chars.get(i) {
                        out.push(blank(e));
                        i += 1;
                    }
                } else if d == '"' {
                    break;
                }
            }
        } else if !in_word
            && (c == 'r' || (c == 'b' && next == Some('r')))
            && raw_string_at(&chars, i).is_some()
        {
            let end = raw_string_at(&chars, i).unwrap_or(chars.len());
            out.extend(chars[i..end].iter().map(|&d| blank(d)));
            i = end;
        } else if c == '\'' && next == Some('\\') {
            // An escaped character: up to the closing quote.
            let start = (i + 3).min(chars.len());
            let end = chars[start..].iter().position(|&d| d == '\'').map_or(chars.len(), |p| start + p + 1);
            out.extend(chars[i..end].iter().map(|&d| blank(d)));
            i = end;
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            out.push_str("   ");
            i += 3;
        } else {
            // A lifetime's quote, or anything else.
            out.push(c);
            i += 1;
        }
    }
    out
}

/// When a raw string (`r"..."`, `r#"..."#`, `br"..."`) starts at `i`, the
/// index just past it.
fn raw_string_at(chars: &[char], i: usize) -> Option<usize> {
    let mut j = i + if chars[i] == 'b' { 2 } else { 1 };
    let mut hashes = 0;
    while chars.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    if chars.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < chars.len() {
        if chars[j] == '"' && (1..=hashes).all(|h| chars.get(j + h) == Some(&'#')) {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(chars.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(name: &str, files: &[(&str, &str)]) -> Sources {
        Sources {
            name: name.to_owned(),
            files: files.iter().map(|(p, t)| (p.to_string(), t.to_string())).collect(),
        }
    }

    fn edges(g: &Graph) -> Vec<String> {
        g.edges.keys().map(|(a, b)| format!("{a}->{b}")).collect()
    }

    #[test]
    fn files_over_the_limit_are_named_with_their_count() {
        let long = "x\n".repeat(MAX_LINES + 1);
        let fine = "x\n".repeat(MAX_LINES);
        let src = tree("pool", &[("pool.rs", &long), ("tls.rs", &fine), ("hub/task.rs", &long)]);
        let found: Vec<String> = long_files(&src).iter().map(ToString::to_string).collect();
        assert_eq!(
            found,
            [
                "crates/pool/src/hub/task.rs: 401 lines, over 400",
                "crates/pool/src/pool.rs: 401 lines, over 400",
            ]
        );
    }

    #[test]
    fn imports_are_read_from_paths_groups_supers_and_the_roots_names() {
        let src = tree(
            "demo",
            &[
                ("lib.rs", "mod a;\nmod b;\nmod c;\nmod d;\nmod e;\npub use e::{Thing as Other, More};\n"),
                ("a.rs", "use crate::{b::X, c};\nfn f() { crate::Other::new(); }\n"),
                // b/inner.rs: `super` is b itself, `super::super` the root.
                ("b/mod.rs", "mod inner;\n"),
                ("b/inner.rs", "use super::helper;\nuse super::super::d::Y;\n"),
                // An inline test module's `super` is the file's own module.
                ("c.rs", "fn g() { let _ = '{'; }\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\nuse super::e;\n"),
                (
                    "d.rs",
                    "// use crate::a;\n/* crate::a */\nconst S: &str = \"crate::a\";\nconst R: &str = r#\"crate::a\"#;\n\
                     fn h<'x>(s: &'x str) -> &'x str { s }\npub(crate) fn k() {}\n",
                ),
                ("e.rs", "pub struct Thing; pub struct More;\n"),
            ],
        );
        let g = graph(&src);
        assert_eq!(g.modules.iter().map(String::as_str).collect::<Vec<_>>(), ["a", "b", "c", "d", "e"]);
        assert_eq!(edges(&g), ["a->b", "a->c", "a->e", "b->d", "c->e"]);
        assert_eq!(g.edges[&("a".to_owned(), "e".to_owned())], "a.rs:2");
        assert_eq!(g.edges[&("c".to_owned(), "e".to_owned())], "c.rs:6");
    }

    #[test]
    fn a_circle_is_reported_with_its_members_and_steps() {
        let src = tree(
            "pool",
            &[
                ("lib.rs", "mod config;\nmod pool;\nmod tls;\nmod codec;\n"),
                ("config.rs", "use crate::pool::PgPool;\n"),
                ("pool.rs", "use crate::tls::Endpoint;\nuse crate::codec::map;\n"),
                ("tls.rs", "use crate::config::PoolError;\n"),
                ("codec.rs", ""),
            ],
        );
        let found: Vec<String> = cycles(&src, &graph(&src)).iter().map(ToString::to_string).collect();
        assert_eq!(
            found,
            ["crates/pool/src: a circle of imports among config, pool, tls: config -> pool (config.rs:1), \
              pool -> tls (pool.rs:1), tls -> config (tls.rs:1)"]
        );
        let fixed =
            tree("pool", &[("lib.rs", "mod a;\nmod b;\n"), ("a.rs", "use crate::b::X;\n"), ("b.rs", "")]);
        assert!(cycles(&fixed, &graph(&fixed)).is_empty());
    }

    const DOC: &str = "# Doc\n\n```text\nnot an order\n```\n\n```text\npool modules, lowest first:\n\
                       error, conninfo -> tls -> manager\n  -> pool\n```\n\n\
                       ```text\nbroken modules, lowest first:\na -> -> b\n```\n";

    #[test]
    fn orders_parse_levels_and_wrapped_lines() {
        let (found, problems) = orders(DOC, "docs/architecture.md");
        assert_eq!(
            found,
            [Order {
                krate: "pool".to_owned(),
                levels: vec![
                    vec!["error".to_owned(), "conninfo".to_owned()],
                    vec!["tls".to_owned()],
                    vec!["manager".to_owned()],
                    vec!["pool".to_owned()],
                ],
                line: 8,
            }]
        );
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].at, "docs/architecture.md:14");
        assert!(problems[0].what.contains("the broken order"), "{}", problems[0]);
    }

    #[test]
    fn an_order_is_checked_both_ways_and_against_every_import() {
        let (found, _) = orders(DOC, "docs/architecture.md");
        let src = tree(
            "pool",
            &[
                ("lib.rs", "mod error;\nmod conninfo;\nmod tls;\nmod pool;\nmod stats;\n"),
                ("error.rs", "use crate::conninfo::X;\n"),
                ("conninfo.rs", ""),
                ("tls.rs", "use crate::{error::E, conninfo::C};\n"),
                ("pool.rs", "use crate::tls::T;\n"),
                ("stats.rs", "use crate::pool::P;\n"),
            ],
        );
        let found: Vec<String> =
            order_problems(&found[0], &src, &graph(&src)).iter().map(ToString::to_string).collect();
        assert_eq!(
            found,
            [
                "crates/pool/src: docs/architecture.md's pool order lists manager, not modules of this crate",
                "crates/pool/src: docs/architecture.md's pool order does not list stats",
                "crates/pool/src/error.rs:1: error imports conninfo, which docs/architecture.md's pool order \
                 lists at its own level (a module may import only modules listed before it)",
            ]
        );
        let upward = tree(
            "pool",
            &[
                ("lib.rs", ""),
                ("error.rs", ""),
                ("conninfo.rs", ""),
                ("manager.rs", ""),
                ("pool.rs", ""),
                ("tls.rs", "\n\nuse crate::pool::PgPool;\n"),
            ],
        );
        let (found, _) = orders(DOC, "docs/architecture.md");
        let found: Vec<String> =
            order_problems(&found[0], &upward, &graph(&upward)).iter().map(ToString::to_string).collect();
        assert_eq!(
            found,
            ["crates/pool/src/tls.rs:3: tls imports pool, which docs/architecture.md's pool order lists after it \
              (a module may import only modules listed before it)"]
        );
    }

    #[test]
    fn a_module_listed_twice_is_named() {
        let order = Order {
            krate: "x".to_owned(),
            levels: vec![vec!["a".to_owned()], vec!["a".to_owned()]],
            line: 1,
        };
        let src = tree("x", &[("a.rs", "")]);
        let found = order_problems(&order, &src, &graph(&src));
        assert_eq!(found[0].what, "docs/architecture.md's x order lists a twice");
    }
}
