//! Property tests: quoted text is inert, numbering is dense and stable, and
//! `bind_order` maps names correctly.

use proptest::prelude::*;
use waymark_dialect::rewrite;

/// One piece of generated SQL.
#[derive(Debug, Clone)]
enum Piece {
    /// `:name`.
    Param(String),
    /// An identifier, number or punctuation: code without parameters.
    Plain(String),
    /// Quoted text or a comment: must come out unchanged.
    Protected(String),
}

fn param() -> impl Strategy<Value = Piece> {
    prop_oneof![
        // A small pool so names repeat, including prefixes of each other.
        3 => prop::sample::select(vec!["a", "b", "id", "ids", "ids_2", "_p", "Names"])
            .prop_map(str::to_owned),
        1 => "[a-zA-Z_][a-zA-Z0-9_]{0,3}",
    ]
    .prop_map(Piece::Param)
}

fn plain() -> impl Strategy<Value = Piece> {
    prop_oneof![
        "[a-zA-Z_][a-zA-Z0-9_]{0,5}",
        "[0-9]{1,3}",
        prop::sample::select(vec![
            "(", ")", ",", "=", "+", "*", "<", ">", "[", "]", ";", ".", "%", "|", ":", "::", "$", "!=", "<>",
            ":=", "&",
        ])
        .prop_map(str::to_owned),
    ]
    .prop_map(Piece::Plain)
}

/// Raw text for inside quotes and comments, full of would-be syntax.
fn raw() -> impl Strategy<Value = String> {
    "[a-z:'\"$*/ \\-\n\\\\é0-9_()]{0,16}"
}

fn protected() -> impl Strategy<Value = Piece> {
    prop_oneof![
        raw().prop_map(|c| format!("'{}'", c.replace('\'', "''"))),
        (raw(), prop::sample::select(vec!["E", "e"])).prop_map(|(c, e)| {
            let mut s = format!("{e}'");
            for (i, ch) in c.chars().enumerate() {
                match ch {
                    '\\' => s.push_str("\\\\"),
                    '\'' if i % 2 == 0 => s.push_str("\\'"),
                    '\'' => s.push_str("''"),
                    _ => s.push(ch),
                }
            }
            s.push('\'');
            s
        }),
        raw().prop_map(|c| format!("\"{}\"", c.replace('"', "\"\""))),
        (raw(), prop::sample::select(vec!["", "t", "fn", "_x1", "T9"])).prop_map(|(c, tag)| {
            let delimiter = format!("${tag}$");
            let body = if format!("{c}{delimiter}").find(&delimiter) == Some(c.len()) {
                c
            } else {
                c.replace('$', "#")
            };
            format!("{delimiter}{body}{delimiter}")
        }),
        raw().prop_map(|c| format!("--{}\n", c.replace(['\n', '\r'], " "))),
        (raw(), raw(), raw(), any::<bool>()).prop_map(|(a, b, c, nest)| {
            let clean = |s: String| s.replace(['*', '/'], "");
            if nest {
                format!("/*{}/*{}*/{}*/", clean(a), clean(b), clean(c))
            } else {
                format!("/*{}*/", clean(a))
            }
        }),
    ]
    .prop_map(Piece::Protected)
}

fn separator() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![" ", "\n", "\t", "  ", " \r\n "])
}

/// Joins pieces with separators; returns the SQL and the expected rewrite.
fn assemble(pieces: &[(Piece, &str)]) -> (String, String, Vec<String>) {
    let mut sql = String::new();
    let mut expected = String::new();
    let mut names: Vec<String> = Vec::new();
    for (piece, sep) in pieces {
        match piece {
            Piece::Param(n) => {
                let slot = match names.iter().position(|x| x == n) {
                    Some(i) => i + 1,
                    None => {
                        names.push(n.clone());
                        names.len()
                    }
                };
                sql.push(':');
                sql.push_str(n);
                expected.push_str(&format!("${slot}"));
            }
            Piece::Plain(s) | Piece::Protected(s) => {
                sql.push_str(s);
                expected.push_str(s);
            }
        }
        sql.push_str(sep);
        expected.push_str(sep);
    }
    (sql, expected, names)
}

/// The `$n` numbers in `sql`, in order (for SQL with no `$digit` other than
/// slots).
fn slots(sql: &str) -> Vec<(usize, usize, usize)> {
    let b = sql.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'$' && b.get(i + 1).is_some_and(u8::is_ascii_digit) {
            let end = (i + 1..b.len()).find(|&j| !b[j].is_ascii_digit()).unwrap_or(b.len());
            out.push((i, end, sql[i + 1..end].parse().unwrap()));
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

fn mixed() -> impl Strategy<Value = Vec<(Piece, &'static str)>> {
    prop::collection::vec((prop_oneof![2 => param(), 2 => plain(), 3 => protected()], separator()), 0..24)
}

fn code_only() -> impl Strategy<Value = Vec<(Piece, &'static str)>> {
    prop::collection::vec((prop_oneof![param(), plain()], separator()), 0..32)
}

proptest! {
    /// (1) Quoted text and comments come out unchanged, and everything else
    /// is exactly the input with each `:name` replaced by its slot.
    #[test]
    fn protected_text_is_unchanged(pieces in mixed()) {
        let (sql, expected, names) = assemble(&pieces);
        let r = rewrite(&sql).unwrap();
        prop_assert_eq!(r.sql(), expected.as_str());
        prop_assert_eq!(r.names(), names.as_slice());
        for (piece, _) in &pieces {
            if let Piece::Protected(text) = piece {
                prop_assert!(r.sql().contains(text.as_str()));
            }
        }
    }

    /// (2) One slot per distinct name, numbered 1..=k by first appearance;
    /// each slot occurs as often as its name did.
    #[test]
    fn slots_are_dense_and_ordered(pieces in code_only()) {
        let (sql, _, _) = assemble(&pieces);
        let r = rewrite(&sql).unwrap();
        let used: Vec<usize> = slots(r.sql()).into_iter().map(|(_, _, n)| n).collect();
        let mut first: Vec<usize> = Vec::new();
        for &n in &used {
            if !first.contains(&n) {
                first.push(n);
            }
        }
        prop_assert_eq!(first, (1..=r.names().len()).collect::<Vec<_>>());
        let mut distinct: Vec<String> = Vec::new();
        for (piece, _) in &pieces {
            if let Piece::Param(n) = piece {
                if !distinct.contains(n) {
                    distinct.push(n.clone());
                }
            }
        }
        prop_assert_eq!(r.names(), distinct.as_slice());
        for (i, name) in r.names().iter().enumerate() {
            let in_sql = pieces.iter().filter(|(p, _)| matches!(p, Piece::Param(n) if n == name)).count();
            prop_assert_eq!(used.iter().filter(|&&n| n == i + 1).count(), in_sql);
        }
    }

    /// (3) Rewriting is deterministic, its output has no parameters left, and
    /// putting the names back gives the input.
    #[test]
    fn numbering_is_stable_and_reversible(pieces in code_only()) {
        let (sql, _, _) = assemble(&pieces);
        let r = rewrite(&sql).unwrap();
        prop_assert_eq!(&rewrite(&sql).unwrap(), &r);
        let again = rewrite(r.sql()).unwrap();
        prop_assert_eq!(again.sql(), r.sql());
        prop_assert!(again.names().is_empty());
        let mut back = String::new();
        let mut copied = 0;
        for (start, end, n) in slots(r.sql()) {
            back.push_str(&r.sql()[copied..start]);
            back.push(':');
            back.push_str(&r.names()[n - 1]);
            copied = end;
        }
        back.push_str(&r.sql()[copied..]);
        prop_assert_eq!(back, sql);
    }

    /// (4) Binding the names in slot order is the identity; any permutation
    /// maps each slot to where its name sits.
    #[test]
    fn bind_order_follows_permutations(
        (pieces, perm) in mixed().prop_flat_map(|pieces| {
            let (_, _, names) = assemble(&pieces);
            let perm = Just(names).prop_shuffle();
            (Just(pieces), perm)
        })
    ) {
        let (sql, _, _) = assemble(&pieces);
        let r = rewrite(&sql).unwrap();
        let names: Vec<&str> = r.names().iter().map(String::as_str).collect();
        prop_assert_eq!(r.bind_order(&names).unwrap(), (0..names.len()).collect::<Vec<_>>());
        let bound: Vec<&str> = perm.iter().map(String::as_str).collect();
        let order = r.bind_order(&bound).unwrap();
        prop_assert_eq!(order.len(), names.len());
        for (slot, &i) in order.iter().enumerate() {
            prop_assert_eq!(bound[i], names[slot]);
        }
    }
}
