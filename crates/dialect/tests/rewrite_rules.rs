//! One case per lexing rule and per error, messages included.

use waymark_dialect::{parameter_names, rewrite, DialectError};

/// Each lexing rule: what it says, the SQL, the SQL it rewrites to, and the
/// slots' names in order.
const RULES: &[(&str, &str, &str, &[&str])] = &[
    (
        "distinct names get slots in first appearance order",
        "select :b, :a, :b, :c, :a",
        "select $1, $2, $1, $3, $2",
        &["b", "a", "c"],
    ),
    ("no parameters leaves sql unchanged", "select 1", "select 1", &[]),
    ("empty sql stays empty", "", "", &[]),
    (
        "longest name wins",
        ":id = any(:ids) and :ids_2 > :id",
        "$1 = any($2) and $3 > $1",
        &["id", "ids", "ids_2"],
    ),
    ("names may start with underscore and hold digits", ":_a1+:B2", "$1+$2", &["_a1", "B2"]),
    (
        "cast is never a parameter",
        ":id::text, x::int8, (:names::text[] is null)",
        "$1::text, x::int8, ($2::text[] is null)",
        &["id", "names"],
    ),
    ("colon without name is left alone", "a[1:2], b := 3, c : d, :1, :", "a[1:2], b := 3, c : d, :1, :", &[]),
    ("identifier right before colon does not stop a parameter", "a[lo:hi]", "a[lo$1]", &["hi"]),
    (
        "single quoted strings are untouched",
        "select ':a', 'it''s :b', :c",
        "select ':a', 'it''s :b', $1",
        &["c"],
    ),
    // standard_conforming_strings: the string is `\`, and :a is code.
    ("backslash does not escape in plain strings", r"'\' || :a", r"'\' || $1", &["a"]),
    (
        "e strings honour backslash escapes",
        r"E'\' :x' || e'a\\' || :y || E''' :w' :z",
        r"E'\' :x' || e'a\\' || $1 || E''' :w' $2",
        &["y", "z"],
    ),
    // `name'...'` is not an E-string: the backslash does not escape.
    ("e prefix must stand alone", r"type'\' :a", r"type'\' $1", &["a"]),
    (
        "quoted identifiers are untouched",
        r#"select "a:b", "say ""x:y""" from t where c = :c"#,
        r#"select "a:b", "say ""x:y""" from t where c = $1"#,
        &["c"],
    ),
    (
        "dollar quoted bodies are untouched",
        "do $$ :a $$; select $fn$ :b $x$ $ $fn$, :c, $_t1$:d$_t1$",
        "do $$ :a $$; select $fn$ :b $x$ $ $fn$, $1, $_t1$:d$_t1$",
        &["c"],
    ),
    ("dollar digit is not a dollar quote", "select $1, :a, $2", "select $1, $1, $2", &["a"]),
    ("dollar inside identifier is not a dollar quote", "select a$b$ :c", "select a$b$ $1", &["c"]),
    (
        "line comments are untouched",
        "-- params: a text\nselect :a -- and :b\n, :c --",
        "-- params: a text\nselect $1 -- and :b\n, $2 --",
        &["a", "c"],
    ),
    (
        "block comments nest",
        "/* :a /* :b */ :c */ :d /**/ :e",
        "/* :a /* :b */ :c */ $1 /**/ $2",
        &["d", "e"],
    ),
    (
        "comment and quote markers inside each other are inert",
        "'--' :a '/*' :b /* ' */ :c -- $$\n:d",
        "'--' $1 '/*' $2 /* ' */ $3 -- $$\n$4",
        &["a", "b", "c", "d"],
    ),
    ("non ascii text is preserved", "select 'é:x', ünï, :a -- ✓ :b", "select 'é:x', ünï, $1 -- ✓ :b", &["a"]),
];

#[test]
fn each_lexing_rule_rewrites_as_it_says() {
    for (rule, sql, expected, names) in RULES {
        let r = rewrite(sql).unwrap_or_else(|e| panic!("{rule}: {e}"));
        assert_eq!(r.sql(), *expected, "{rule}");
        assert_eq!(r.names(), *names, "{rule}: the slots' names");
    }
}

#[test]
fn parameter_names_matches_rewrite() {
    let sql = "select :b, ':x', :a, :b";
    assert_eq!(parameter_names(sql).unwrap(), ["b", "a"]);
    assert_eq!(parameter_names(sql).unwrap(), rewrite(sql).unwrap().names());
}

/// Each unterminated construct: the SQL, what is unterminated, and the byte
/// where it starts (an E-string's at its prefix; a block comment's counts
/// nesting).
#[test]
fn every_entry_point_reports_an_unterminated_construct_and_where_it_starts() {
    for (sql, what, offset) in [
        ("select :a, 'it''s", "string literal", 11),
        (r"x = E'\'", "string literal", 4),
        (r#"select "a"""#, "quoted identifier", 7),
        ("do $fn$ begin end $f$", "dollar-quoted body", 3),
        ("x /* a /* b */ c", "block comment", 2),
    ] {
        let err = rewrite(sql).unwrap_err();
        assert_eq!(err, DialectError::Unterminated { what, offset }, "{sql}");
        assert_eq!(parameter_names(sql).unwrap_err(), err, "{sql}");
        assert_eq!(waymark_dialect::specialise(sql, &[]).unwrap_err(), err, "{sql}");
        assert_eq!(err.to_string(), format!("unterminated {what} starting at byte {offset}"));
    }
}

#[test]
fn bind_order_maps_slots_to_bound_positions() {
    let r = rewrite("select :b, :a").unwrap();
    assert_eq!(r.bind_order(&["a", "b"]).unwrap(), [1, 0]);
    assert_eq!(r.bind_order(&["b", "a"]).unwrap(), [0, 1]);
    assert_eq!(rewrite("select 1").unwrap().bind_order(&[]).unwrap(), Vec::<usize>::new());
}

/// Each way bound names can fail to fit the SQL's: the SQL, the names
/// bound, the error and its message.
#[test]
fn bind_order_names_the_parameter_that_does_not_fit() {
    let name = |n: &str| n.to_owned();
    for (sql, bound, expected, message) in [
        (
            "select :a, :b",
            &["a"][..],
            DialectError::Unbound { name: name("b") },
            "parameter `b` is used in the sql but not bound",
        ),
        (
            "select :a",
            &["z", "a"],
            DialectError::Unused { name: name("z") },
            "parameter `z` is bound but the sql never uses it",
        ),
        (
            "select :a",
            &["a", "a"],
            DialectError::DuplicateBinding { name: name("a") },
            "parameter `a` is bound more than once",
        ),
    ] {
        let err = rewrite(sql).unwrap().bind_order(bound).unwrap_err();
        assert_eq!(err, expected, "{sql} bound to {bound:?}");
        assert_eq!(err.to_string(), message);
    }
}

#[test]
fn bind_order_checks_duplicates_first() {
    let r = rewrite("select :a, :b").unwrap();
    assert_eq!(
        r.bind_order(&["x", "x"]).unwrap_err(),
        DialectError::DuplicateBinding { name: "x".to_owned() }
    );
}
