//! One test per lexing rule and per error, messages included.

use waymark_dialect::{parameter_names, rewrite, DialectError};

fn rw(sql: &str) -> (String, Vec<String>) {
    let r = rewrite(sql).unwrap();
    (r.sql().to_owned(), r.names().to_vec())
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn distinct_names_get_slots_in_first_appearance_order() {
    assert_eq!(
        rw("select :b, :a, :b, :c, :a"),
        ("select $1, $2, $1, $3, $2".to_owned(), names(&["b", "a", "c"]))
    );
}

#[test]
fn no_parameters_leaves_sql_unchanged() {
    assert_eq!(rw("select 1"), ("select 1".to_owned(), vec![]));
    assert_eq!(rw(""), (String::new(), vec![]));
}

#[test]
fn longest_name_wins() {
    assert_eq!(
        rw(":id = any(:ids) and :ids_2 > :id"),
        ("$1 = any($2) and $3 > $1".to_owned(), names(&["id", "ids", "ids_2"]))
    );
}

#[test]
fn names_may_start_with_underscore_and_hold_digits() {
    assert_eq!(rw(":_a1+:B2"), ("$1+$2".to_owned(), names(&["_a1", "B2"])));
}

#[test]
fn cast_is_never_a_parameter() {
    assert_eq!(
        rw(":id::text, x::int8, (:names::text[] is null)"),
        ("$1::text, x::int8, ($2::text[] is null)".to_owned(), names(&["id", "names"]))
    );
}

#[test]
fn colon_without_name_is_left_alone() {
    assert_eq!(rw("a[1:2], b := 3, c : d, :1, :"), ("a[1:2], b := 3, c : d, :1, :".to_owned(), vec![]));
}

#[test]
fn identifier_right_before_colon_does_not_stop_a_parameter() {
    assert_eq!(rw("a[lo:hi]"), ("a[lo$1]".to_owned(), names(&["hi"])));
}

#[test]
fn single_quoted_strings_are_untouched() {
    assert_eq!(rw("select ':a', 'it''s :b', :c"), ("select ':a', 'it''s :b', $1".to_owned(), names(&["c"])));
}

#[test]
fn backslash_does_not_escape_in_plain_strings() {
    // standard_conforming_strings: the string is `\`, and :a is code.
    assert_eq!(rw(r"'\' || :a"), (r"'\' || $1".to_owned(), names(&["a"])));
}

#[test]
fn e_strings_honour_backslash_escapes() {
    assert_eq!(
        rw(r"E'\' :x' || e'a\\' || :y || E''' :w' :z"),
        (r"E'\' :x' || e'a\\' || $1 || E''' :w' $2".to_owned(), names(&["y", "z"]))
    );
}

#[test]
fn e_prefix_must_stand_alone() {
    // `name'...'` is not an E-string: the backslash does not escape.
    assert_eq!(rw(r"type'\' :a"), (r"type'\' $1".to_owned(), names(&["a"])));
}

#[test]
fn quoted_identifiers_are_untouched() {
    assert_eq!(
        rw(r#"select "a:b", "say ""x:y""" from t where c = :c"#),
        (r#"select "a:b", "say ""x:y""" from t where c = $1"#.to_owned(), names(&["c"]))
    );
}

#[test]
fn dollar_quoted_bodies_are_untouched() {
    assert_eq!(
        rw("do $$ :a $$; select $fn$ :b $x$ $ $fn$, :c, $_t1$:d$_t1$"),
        ("do $$ :a $$; select $fn$ :b $x$ $ $fn$, $1, $_t1$:d$_t1$".to_owned(), names(&["c"]))
    );
}

#[test]
fn dollar_digit_is_not_a_dollar_quote() {
    assert_eq!(rw("select $1, :a, $2"), ("select $1, $1, $2".to_owned(), names(&["a"])));
}

#[test]
fn dollar_inside_identifier_is_not_a_dollar_quote() {
    assert_eq!(rw("select a$b$ :c"), ("select a$b$ $1".to_owned(), names(&["c"])));
}

#[test]
fn line_comments_are_untouched() {
    assert_eq!(
        rw("-- params: a text\nselect :a -- and :b\n, :c --"),
        ("-- params: a text\nselect $1 -- and :b\n, $2 --".to_owned(), names(&["a", "c"]))
    );
}

#[test]
fn block_comments_nest() {
    assert_eq!(
        rw("/* :a /* :b */ :c */ :d /**/ :e"),
        ("/* :a /* :b */ :c */ $1 /**/ $2".to_owned(), names(&["d", "e"]))
    );
}

#[test]
fn comment_and_quote_markers_inside_each_other_are_inert() {
    assert_eq!(
        rw("'--' :a '/*' :b /* ' */ :c -- $$\n:d"),
        ("'--' $1 '/*' $2 /* ' */ $3 -- $$\n$4".to_owned(), names(&["a", "b", "c", "d"]))
    );
}

#[test]
fn non_ascii_text_is_preserved() {
    assert_eq!(
        rw("select 'é:x', ünï, :a -- ✓ :b"),
        ("select 'é:x', ünï, $1 -- ✓ :b".to_owned(), names(&["a"]))
    );
}

#[test]
fn parameter_names_matches_rewrite() {
    let sql = "select :b, ':x', :a, :b";
    assert_eq!(parameter_names(sql).unwrap(), names(&["b", "a"]));
    assert_eq!(parameter_names(sql).unwrap(), rewrite(sql).unwrap().names());
}

fn unterminated(sql: &str) -> DialectError {
    let err = rewrite(sql).unwrap_err();
    assert_eq!(parameter_names(sql).unwrap_err(), err);
    assert_eq!(waymark_dialect::specialise(sql, &[]).unwrap_err(), err);
    err
}

#[test]
fn unterminated_string_literal() {
    let err = unterminated("select :a, 'it''s");
    assert_eq!(err, DialectError::Unterminated { what: "string literal", offset: 11 });
    assert_eq!(err.to_string(), "unterminated string literal starting at byte 11");
}

#[test]
fn unterminated_e_string_reports_the_prefix() {
    let err = unterminated(r"x = E'\'");
    assert_eq!(err, DialectError::Unterminated { what: "string literal", offset: 4 });
}

#[test]
fn unterminated_quoted_identifier() {
    let err = unterminated(r#"select "a"""#);
    assert_eq!(err, DialectError::Unterminated { what: "quoted identifier", offset: 7 });
    assert_eq!(err.to_string(), "unterminated quoted identifier starting at byte 7");
}

#[test]
fn unterminated_dollar_quoted_body() {
    let err = unterminated("do $fn$ begin end $f$");
    assert_eq!(err, DialectError::Unterminated { what: "dollar-quoted body", offset: 3 });
    assert_eq!(err.to_string(), "unterminated dollar-quoted body starting at byte 3");
}

#[test]
fn unterminated_block_comment_counts_nesting() {
    let err = unterminated("x /* a /* b */ c");
    assert_eq!(err, DialectError::Unterminated { what: "block comment", offset: 2 });
    assert_eq!(err.to_string(), "unterminated block comment starting at byte 2");
}

#[test]
fn bind_order_maps_slots_to_bound_positions() {
    let r = rewrite("select :b, :a").unwrap();
    assert_eq!(r.bind_order(&["a", "b"]).unwrap(), [1, 0]);
    assert_eq!(r.bind_order(&["b", "a"]).unwrap(), [0, 1]);
    assert_eq!(rewrite("select 1").unwrap().bind_order(&[]).unwrap(), Vec::<usize>::new());
}

#[test]
fn bind_order_unbound() {
    let err = rewrite("select :a, :b").unwrap().bind_order(&["a"]).unwrap_err();
    assert_eq!(err, DialectError::Unbound { name: "b".to_owned() });
    assert_eq!(err.to_string(), "parameter `b` is used in the sql but not bound");
}

#[test]
fn bind_order_unused() {
    let err = rewrite("select :a").unwrap().bind_order(&["z", "a"]).unwrap_err();
    assert_eq!(err, DialectError::Unused { name: "z".to_owned() });
    assert_eq!(err.to_string(), "parameter `z` is bound but the sql never uses it");
}

#[test]
fn bind_order_duplicate() {
    let err = rewrite("select :a").unwrap().bind_order(&["a", "a"]).unwrap_err();
    assert_eq!(err, DialectError::DuplicateBinding { name: "a".to_owned() });
    assert_eq!(err.to_string(), "parameter `a` is bound more than once");
}

#[test]
fn bind_order_checks_duplicates_first() {
    let r = rewrite("select :a, :b").unwrap();
    assert_eq!(
        r.bind_order(&["x", "x"]).unwrap_err(),
        DialectError::DuplicateBinding { name: "x".to_owned() }
    );
}
