//! What waymark-pool's codec reads, by column type, on a real PostgreSQL:
//! through the pool (rows decoded as they stream in) and through a bare
//! client (`decode_rows`), every type it decodes, a NULL of each, JSON that
//! serde_json cannot hold, and a type it does not decode.

use serde_json::json;
use waymark_pool::PgPool;
use waymark_store::{ExecError, ExecErrorKind, Lane, PgExecutor, Row, Sql, Value};
use waymark_tests::client_executor::ClientExecutor;
use waymark_tests::TestSchema;

fn sql(text: &str) -> Sql<'_> {
    Sql { text, types: &[], lane: Lane::Ordinary, repeatable: true }
}

/// Each column: its SQL, its name, and the value it must decode to.
fn every_type() -> Vec<(&'static str, &'static str, Value)> {
    vec![
        ("true", "b", Value::Bool(true)),
        ("(-7)::int2", "i2", Value::Int4(-7)),
        ("70000::int4", "i4", Value::Int4(70_000)),
        ("5000000000::int8", "i8", Value::Int8(5_000_000_000)),
        ("1.5::float4", "f4", Value::Float8(1.5)),
        ("(-2.25)::float8", "f8", Value::Float8(-2.25)),
        ("'tëxt'::text", "t", Value::Text("tëxt".into())),
        ("'vc'::varchar", "vc", Value::Text("vc".into())),
        ("'nm'::name", "nm", Value::Text("nm".into())),
        ("'bp'::char(3)", "bp", Value::Text("bp ".into())),
        (r#"'{"a": [1, 2.5, "x"]}'::jsonb"#, "jb", Value::Jsonb(json!({ "a": [1, 2.5, "x"] }))),
        (r#"'{"b": null}'::json"#, "js", Value::Jsonb(json!({ "b": null }))),
        ("'{}'::jsonb", "empty", Value::Jsonb(json!({}))),
        // Legal jsonb past f64's range: kept as its text (which jsonb
        // writes out in full), not a failed row.
        ("'1e400'::jsonb", "big", Value::Text(format!("1{}", "0".repeat(400)))),
        ("array['x', 'y']::text[]", "ta", Value::TextArray(vec!["x".into(), "y".into()])),
        ("array['v']::varchar[]", "va", Value::TextArray(vec!["v".into()])),
        ("array['n']::name[]", "na", Value::TextArray(vec!["n".into()])),
    ]
}

/// The NULL of each type `every_type` reads.
const NULL_TYPES: [&str; 12] = [
    "bool", "int2", "int4", "int8", "float4", "float8", "text", "varchar", "jsonb", "json", "text[]", "name",
];

async fn check_every_type<E: PgExecutor>(exec: &E, through: &str) {
    let columns = every_type();
    let select =
        columns.iter().map(|(expr, name, _)| format!("{expr} as {name}")).collect::<Vec<_>>().join(", ");
    // Two rows, so that the second decodes with the first's column names.
    let text = format!("select {select} from generate_series(1, 2)");
    let rows = exec.query(sql(&text), &[]).await.unwrap_or_else(|e| panic!("{through}: {e}"));
    assert_eq!(rows.len(), 2, "{through}");
    for row in &rows {
        for (_, name, want) in &columns {
            assert_eq!(row.get(name), Some(want), "{through}: column {name}");
        }
    }

    let nulls = NULL_TYPES
        .iter()
        .enumerate()
        .map(|(i, ty)| format!("null::{ty} as n{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    let rows: Vec<Row> =
        exec.query(sql(&format!("select {nulls}")), &[]).await.unwrap_or_else(|e| panic!("{through}: {e}"));
    for (i, ty) in NULL_TYPES.iter().enumerate() {
        assert_eq!(rows[0].get(&format!("n{i}")), Some(&Value::Null), "{through}: a null {ty}");
    }

    // A type not read here fails, its null too: a query must not pass
    // only while its data happens to be null.
    for stamped in ["now()", "null::timestamptz"] {
        let err: ExecError = exec
            .query(sql(&format!("select 1 as fine, {stamped} as stamped")), &[])
            .await
            .expect_err("a timestamptz column is not decoded");
        assert_eq!(err.kind(), ExecErrorKind::Query, "{through}, {stamped}: {err}");
        assert!(
            err.to_string().contains("column stamped has type timestamptz"),
            "{through}, {stamped}: {err}"
        );
    }
}

#[tokio::test]
async fn every_decoded_type_reads_the_same_through_the_pool_and_a_bare_client() {
    let schema = TestSchema::new().await;
    let pool = PgPool::builder(&schema.url).max_size(2).build().expect("pool");
    check_every_type(&pool, "the pool").await;
    let prepared = PgPool::builder(&schema.url).max_size(2).prepared_statements(true).build().expect("pool");
    check_every_type(&prepared, "the pool, prepared").await;
    let client = ClientExecutor::connect(&schema.url, None).await.expect("client");
    check_every_type(&client, "a bare client").await;
    schema.drop().await;
}
