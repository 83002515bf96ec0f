//! `cargo xtask tidy`: the rules a build cannot check.
//!
//! - SQL lives in `protocol-sql/` only. Outside it, SQL text may appear in
//!   tests (`tests/`, and `#[cfg(test)]` code, which by this project's
//!   habit ends each file) and in the bench's raw-SQL baseline; the words of
//!   transaction control (`begin`, `commit`, `rollback`) belong to the
//!   executors. Anything else that reads as a statement is reported. The
//!   check reads plain literals line by line, by the shape of their first
//!   words: a statement split across lines, built with `concat!` or held
//!   in a raw string escapes it, which review has to catch.
//! - Crates depend on each other as the "Layering" list of
//!   `docs/architecture.md` says, and on no other waymark crate.
//!
//! - No dependency declares a `rust-version` newer than the workspace's,
//!   so the declared MSRV builds (the toolchain here is the only one that
//!   can be fetched; clippy's `incompatible_msrv`, denied in CI, checks
//!   waymark's own use of std against it).
//! - Inside each crate (`house.rs`): no source file of `crates/*/src` over
//!   400 lines; no circle of imports among a crate's modules; and the
//!   module order docs/architecture.md declares for a crate, where it
//!   declares one. Every problem is reported, each file with its count,
//!   each circle with its modules and the imports that close it.
//!
//! A module is a top-level file or folder of a crate's `src/` (`foo.rs`
//! and `foo/` are one module; `lib.rs` or `main.rs`, the root, is none).
//! Module A imports B when a file of A names `crate::B`, a name the root
//! brings in from B (`crate::Name` where the root has `pub use B::Name`),
//! or a path through `super::` that reaches the root and goes on to B.
//! This is read from the text: comments and literals are skipped, inline
//! `mod name { ... }` blocks count for `super::`, and a macro's own paths
//! are not followed.
//!
//! A module order is a fenced `text` block of docs/architecture.md whose
//! first line is `<crate> modules, lowest first:`, `<crate>` being the
//! folder under `crates/`; the rest of the block is the levels, lowest
//! first, separated by `->`, the modules of one level by `,` (a line
//! break counts as a space, so a long order may wrap):
//!
//! ```text
//! pool modules, lowest first:
//! error, conninfo -> tls -> manager -> pool
//! ```
//!
//! A module may import only modules of the levels before its own (so two
//! of one level never import each other), and the block lists every
//! module of the crate and no other name.
//!
//! All but the MSRV check also run as unit tests of xtask, so `cargo
//! xtask test` keeps them; the MSRV check asks `cargo metadata`, and runs
//! in `cargo xtask tidy` (CI runs it).

mod house;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Files (or folders, ending in `/`) that may hold SQL text although they
/// are not under `tests/`: the bench's raw-SQL baseline, and the testing
/// crate, which is test code shipped to users (schemas per test, rows
/// written as another client would).
const SQL_ALLOWED: &[&str] = &["xtask/src/bench/baseline.rs", "crates/testing/"];

pub fn run(args: &[String]) -> Result<(), String> {
    if !args.is_empty() {
        return Err("tidy takes no arguments".to_owned());
    }
    let root = crate::workspace_root();
    let mut problems = sql_outside_protocol(&root)?;
    problems.extend(layering(&root)?);
    problems.extend(inside_crates(&root)?.iter().map(ToString::to_string));
    let (msrv, checked, newer) = dependencies_above_msrv(&root)?;
    problems.extend(newer);
    if problems.is_empty() {
        println!(
            "tidy: SQL only in protocol-sql/; the crates layered as docs/architecture.md says; \
             no source file over {} lines, no circle of imports, and the module orders \
             docs/architecture.md declares kept, in every crate; \
             none of {checked} dependencies needs a Rust newer than {msrv}",
            house::MAX_LINES
        );
        return Ok(());
    }
    for p in &problems {
        println!("tidy: {p}");
    }
    Err(format!("tidy: {} problem(s), listed above", problems.len()))
}

/// The problems inside every crate: files over the limit, circles of
/// imports, and imports against a declared module order (and the orders
/// that do not parse, or name a crate `crates/` does not hold).
pub fn inside_crates(root: &Path) -> Result<Vec<house::Problem>, String> {
    let doc_path = "docs/architecture.md";
    let doc = std::fs::read_to_string(root.join(doc_path)).map_err(|e| format!("{doc_path}: {e}"))?;
    let (orders, mut problems) = house::orders(&doc, doc_path);
    let entries = std::fs::read_dir(root.join("crates")).map_err(|e| format!("crates/: {e}"))?;
    let mut names: Vec<String> = entries
        .flatten()
        .filter(|e| e.path().join("src").is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for order in orders.iter().filter(|o| !names.contains(&o.krate)) {
        problems.push(house::Problem {
            at: format!("{doc_path}:{}", order.line),
            what: format!("an order for crates/{}, which does not exist", order.krate),
        });
    }
    for name in &names {
        let src = house::Sources::read(root, name)?;
        let graph = house::graph(&src);
        problems.extend(house::long_files(&src));
        problems.extend(house::cycles(&src, &graph));
        for order in orders.iter().filter(|o| o.krate == *name) {
            problems.extend(house::order_problems(order, &src, &graph));
        }
    }
    Ok(problems)
}

/// Every string literal outside tests that reads as SQL, as `path:line: text`.
pub fn sql_outside_protocol(root: &Path) -> Result<Vec<String>, String> {
    let mut found = Vec::new();
    for file in rust_sources(root)? {
        let rel = file.strip_prefix(root).unwrap_or(&file).to_string_lossy().replace('\\', "/");
        let allowed = |a: &&str| if a.ends_with('/') { rel.starts_with(*a) } else { rel == *a };
        if rel.starts_with("crates/protocol/") || SQL_ALLOWED.iter().any(allowed) {
            continue;
        }
        let text = std::fs::read_to_string(&file).map_err(|e| format!("{rel}: {e}"))?;
        for (line, literal) in sql_literals(&text) {
            found.push(format!("{rel}:{line}: SQL outside protocol-sql/: {literal:?}"));
        }
    }
    Ok(found)
}

/// The `.rs` files under `crates/*/src` and `xtask/src`.
fn rust_sources(root: &Path) -> Result<Vec<PathBuf>, String> {
    let mut dirs: Vec<PathBuf> = vec![root.join("xtask/src")];
    let crates = std::fs::read_dir(root.join("crates")).map_err(|e| format!("crates/: {e}"))?;
    for entry in crates.flatten() {
        dirs.push(entry.path().join("src"));
    }
    let mut files = Vec::new();
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

/// The string literals of `source` that read as SQL, with their line
/// numbers; code from the first `#[cfg(test)]` on is a test and skipped.
fn sql_literals(source: &str) -> Vec<(usize, String)> {
    let code = source.split("#[cfg(test)]").next().unwrap_or(source);
    let mut out = Vec::new();
    for (n, line) in code.lines().enumerate() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        for literal in string_literals(line) {
            if reads_as_sql(&literal) {
                out.push((n + 1, literal));
            }
        }
    }
    out
}

/// The contents of the plain `"..."` literals on one line.
fn string_literals(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\'' {
            // A char literal such as '"': skip it whole.
            let rest: String = chars.clone().take(3).collect();
            if rest.starts_with("\"'") || rest.starts_with("\\\"'") {
                chars.nth(if rest.starts_with('\\') { 2 } else { 1 });
            }
            continue;
        }
        if c != '"' {
            continue;
        }
        let mut literal = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => {
                    if let Some(escaped) = chars.next() {
                        literal.push(escaped);
                    }
                }
                '"' => break,
                c => literal.push(c),
            }
        }
        out.push(literal);
    }
    out
}

/// Whether a literal has the shape of a statement, not of a message that
/// merely starts with an SQL word ("listen failed; ...").
fn reads_as_sql(literal: &str) -> bool {
    let lower = literal.trim().to_ascii_lowercase();
    let words: Vec<&str> = lower.split_whitespace().collect();
    let (Some(&first), second) = (words.first(), words.get(1).copied().unwrap_or("")) else { return false };
    let has = |w: &str| words.contains(&w);
    match first {
        "select" => {
            has("from")
                || second.starts_with('$')
                || second.starts_with("pg_")
                || second == "*"
                || second.chars().all(|c| c.is_ascii_digit())
        }
        "insert" => second == "into",
        "update" => words.get(2) == Some(&"set"),
        "delete" => second == "from",
        "create" | "drop" | "alter" => matches!(
            second,
            "table"
                | "index"
                | "unique"
                | "schema"
                | "database"
                | "extension"
                | "function"
                | "trigger"
                | "type"
                | "view"
                | "role"
                | "or"
                | "sequence"
        ),
        "truncate" => second == "table" || words.len() == 2,
        "copy" => has("from") || has("to"),
        "listen" | "unlisten" | "notify" => {
            words.len() <= 2 && (second == "*" || second.starts_with('"') || second.ends_with(';'))
                || lower.contains("pg_notify(")
        }
        "set" | "show" | "reset" => {
            words.len() <= 4
                && matches!(
                    second.trim_end_matches(';'),
                    "search_path"
                        | "lock_timeout"
                        | "statement_timeout"
                        | "local"
                        | "session"
                        | "synchronous_commit"
                        | "all"
                        | "role"
                )
        }
        "with" => has("as") && (has("select") || has("insert") || has("update") || has("delete")),
        "explain" | "analyze" | "vacuum" => words.len() >= 2 && !lower.contains(": "),
        _ => false,
    }
}

/// What the "Layering" list of docs/architecture.md allows each crate.
fn allowed_layers(root: &Path) -> Result<BTreeMap<String, BTreeSet<String>>, String> {
    let doc = std::fs::read_to_string(root.join("docs/architecture.md"))
        .map_err(|e| format!("docs/architecture.md: {e}"))?;
    let section =
        doc.split("\n## Layering\n").nth(1).ok_or("docs/architecture.md has no \"## Layering\" section")?;
    let mut allowed = BTreeMap::new();
    for line in section.lines().take_while(|l| !l.starts_with("## ")) {
        let Some(entry) = line.strip_prefix("- `") else { continue };
        let Some((krate, deps)) = entry.split_once("`:") else { continue };
        let deps = deps
            .split(',')
            .map(|d| d.trim().trim_end_matches('.').trim_matches('`').to_owned())
            .filter(|d| d.starts_with("waymark"))
            .collect();
        allowed.insert(krate.to_owned(), deps);
    }
    if allowed.is_empty() {
        return Err("docs/architecture.md's Layering section lists no crate".to_owned());
    }
    Ok(allowed)
}

/// Each dependency of a workspace crate on another waymark crate that the
/// Layering list does not allow, and each crate the list does not name.
pub fn layering(root: &Path) -> Result<Vec<String>, String> {
    let allowed = allowed_layers(root)?;
    let mut problems = Vec::new();
    let crates = std::fs::read_dir(root.join("crates")).map_err(|e| format!("crates/: {e}"))?;
    let mut manifests: Vec<PathBuf> = crates.flatten().map(|e| e.path().join("Cargo.toml")).collect();
    manifests.sort();
    for manifest in manifests {
        let text = std::fs::read_to_string(&manifest).map_err(|e| format!("{}: {e}", manifest.display()))?;
        let (name, deps) = waymark_dependencies(&text);
        let Some(may) = allowed.get(&name) else {
            problems.push(format!("crate {name} is not in docs/architecture.md's Layering list"));
            continue;
        };
        for dep in deps.iter().filter(|d| !may.contains(*d)) {
            problems.push(format!("{name} depends on {dep}, which the Layering list does not allow it"));
        }
    }
    Ok(problems)
}

/// A manifest's package name and its `[dependencies]` on waymark crates
/// (dev-dependencies are tests').
fn waymark_dependencies(manifest: &str) -> (String, Vec<String>) {
    let mut name = String::new();
    let mut deps = Vec::new();
    let mut section = "";
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
            continue;
        }
        let Some((key, value)) = line.split_once('=') else { continue };
        let key = key.trim();
        if section == "[package]" && key == "name" {
            name = value.trim().trim_matches('"').to_owned();
        } else if section == "[dependencies]" && key.starts_with("waymark") {
            deps.push(key.split('.').next().unwrap_or(key).to_owned());
        }
    }
    (name, deps)
}

/// The workspace's `rust-version`, how many dependencies were checked, and
/// each that declares a newer one.
fn dependencies_above_msrv(root: &Path) -> Result<(String, usize, Vec<String>), String> {
    let manifest =
        std::fs::read_to_string(root.join("Cargo.toml")).map_err(|e| format!("Cargo.toml: {e}"))?;
    let msrv = manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix("rust-version").and_then(|r| r.trim().strip_prefix('=')))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .ok_or("the workspace Cargo.toml declares no rust-version")?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--filter-platform", "x86_64-unknown-linux-gnu"])
        .current_dir(root)
        .output()
        .map_err(|e| format!("running cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("reading cargo metadata: {e}"))?;
    let packages = meta["packages"].as_array().ok_or("cargo metadata: no packages")?;
    let mut newer = Vec::new();
    for p in packages.iter().filter(|p| !p["source"].is_null()) {
        if let Some(rv) = p["rust_version"].as_str().filter(|rv| newer_than(rv, &msrv)) {
            newer.push(format!(
                "{} {} needs Rust {rv}, newer than the workspace's {msrv}",
                p["name"], p["version"]
            ));
        }
    }
    Ok((msrv, packages.len(), newer))
}

/// Whether version `a` (such as `1.90` or `1.85.1`) is newer than `b`.
fn newer_than(a: &str, b: &str) -> bool {
    let parts = |v: &str| -> Vec<u64> { v.split('.').map(|n| n.parse().unwrap_or(0)).collect() };
    let (mut a, mut b) = (parts(a), parts(b));
    let len = a.len().max(b.len());
    a.resize(len, 0);
    b.resize(len, 0);
    a > b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workspace_is_tidy() {
        let root = crate::workspace_root();
        assert_eq!(sql_outside_protocol(&root).unwrap(), Vec::<String>::new());
        assert_eq!(layering(&root).unwrap(), Vec::<String>::new());
        let inside: Vec<String> = inside_crates(&root).unwrap().into_iter().map(|p| p.to_string()).collect();
        assert_eq!(inside, Vec::<String>::new());
    }

    #[test]
    fn statements_are_found_and_messages_are_not() {
        let source = r#"
fn f() {
    client.batch_execute("select 1");
    client.query("SELECT id FROM cairnq_tasks WHERE id = $1", &[]);
    let s = "update cairnq_tasks set status = 'queued'";
    let l = "listen \"cairnq_queued\";";
    let n = "select pg_notify($1, $2)";
    tracing::warn!("listen failed; waits poll until it comes back");
    let e = "lock timeout in submit: another transaction held the lock";
    let t = "commit";
    // "select * from ignored_in_a_comment"
}
#[cfg(test)]
mod tests { const Q: &str = "delete from t"; }
"#;
        let lines: Vec<usize> = sql_literals(source).into_iter().map(|(n, _)| n).collect();
        assert_eq!(lines, [3, 4, 5, 6, 7]);
    }

    #[test]
    fn versions_compare_part_by_part() {
        assert!(newer_than("1.90", "1.89"));
        assert!(newer_than("1.89.1", "1.89"));
        assert!(!newer_than("1.89.0", "1.89"));
        assert!(!newer_than("1.70", "1.89"));
        assert!(newer_than("2.0", "1.89"));
    }

    #[test]
    fn a_dependency_outside_the_layering_is_named() {
        let (name, deps) = waymark_dependencies(
            "[package]\nname = \"waymark-dialect\"\n\n[dependencies]\nwaymark-store.workspace = true\n\
             thiserror.workspace = true\n\n[dev-dependencies]\nwaymark-protocol.workspace = true\n",
        );
        assert_eq!(
            (name.as_str(), deps.as_slice()),
            ("waymark-dialect", ["waymark-store".to_owned()].as_slice())
        );
        let allowed = allowed_layers(&crate::workspace_root()).unwrap();
        assert!(!allowed["waymark-dialect"].contains("waymark-store"), "dialect sits below the store");
    }
}
