//! Optional-filter specialisation.

use waymark_dialect::{specialise, DialectError};

const LIST: &str = "select * from t\n where (:status::text is null or status = :status)\n   and (:queue::text is null or queue = :queue)\n limit :limit";

#[test]
fn drops_heads_for_non_null_names_only() {
    assert_eq!(
        specialise(LIST, &["status"]).unwrap(),
        "select * from t\n where (status = :status)\n   and (:queue::text is null or queue = :queue)\n limit :limit"
    );
    assert_eq!(
        specialise(LIST, &["queue", "status"]).unwrap(),
        "select * from t\n where (status = :status)\n   and (queue = :queue)\n limit :limit"
    );
}

#[test]
fn empty_non_null_is_identity() {
    assert_eq!(specialise(LIST, &[]).unwrap(), LIST);
}

#[test]
fn names_without_groups_change_nothing() {
    assert_eq!(specialise(LIST, &["limit", "nope"]).unwrap(), LIST);
}

#[test]
fn array_types() {
    assert_eq!(
        specialise("and (:names::text[] is null or name = any(:names))", &["names"]).unwrap(),
        "and (name = any(:names))"
    );
}

#[test]
fn multi_word_qualified_and_modified_types() {
    for ty in ["double precision", "pg_catalog.text", "varchar(10)", "numeric(10, 2)[]", "\"My Type\""] {
        let sql = format!("(:p::{ty} is null or x = :p)");
        assert_eq!(specialise(&sql, &["p"]).unwrap(), "(x = :p)", "type {ty}");
    }
}

#[test]
fn keywords_are_case_insensitive_and_spacing_free() {
    assert_eq!(
        specialise("( \n :p :: TEXT\tIS\n  NuLl /* c */ Or\n\tx = :p\n)", &["p"]).unwrap(),
        "( \n x = :p\n)"
    );
}

#[test]
fn comment_right_after_or_is_kept() {
    assert_eq!(specialise("(:p::text is null or -- why\n x)", &["p"]).unwrap(), "(-- why\n x)");
}

#[test]
fn rest_runs_to_the_matching_paren_honouring_quotes_and_comments() {
    let sql = "(:p::text is null or (a = ')') and f(\")\") /* ) */ or b = $$)$$) and c";
    assert_eq!(specialise(sql, &["p"]).unwrap(), "((a = ')') and f(\")\") /* ) */ or b = $$)$$) and c");
}

#[test]
fn nested_groups_are_handled_independently() {
    let sql = "(:a::text is null or (:b::text is null or x = :b) and y = :a)";
    assert_eq!(specialise(sql, &["a"]).unwrap(), "((:b::text is null or x = :b) and y = :a)");
    assert_eq!(specialise(sql, &["b"]).unwrap(), "(:a::text is null or (x = :b) and y = :a)");
    assert_eq!(specialise(sql, &["a", "b"]).unwrap(), "((x = :b) and y = :a)");
}

#[test]
fn other_shapes_are_left_alone() {
    for sql in [
        "(:p::text is not null or x)",
        "(:p is null or x)",
        "(x and :p::text is null or y)",
        "(:p::text is null and x)",
        "(:p::text is null or )",
        "(:p::text is null or x",
        ":p::text is null or x",
        "(:p::text isnull or x)",
        "(':p::text is null or x')",
        "(-- :p::text is null or x\n)",
    ] {
        assert_eq!(specialise(sql, &["p"]).unwrap(), sql, "{sql}");
    }
}

#[test]
fn quoted_lookalikes_are_not_groups() {
    let sql = "select '(:p::text is null or x)', $$(:p::text is null or x)$$, (:p::text is null or y)";
    assert_eq!(
        specialise(sql, &["p"]).unwrap(),
        "select '(:p::text is null or x)', $$(:p::text is null or x)$$, (y)"
    );
}

#[test]
fn unterminated_input_is_an_error() {
    assert_eq!(
        specialise("(:p::text is null or x = 'a)", &["p"]).unwrap_err(),
        DialectError::Unterminated { what: "string literal", offset: 25 }
    );
}
