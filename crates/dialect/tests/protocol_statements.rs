//! Every statement of the protocol catalogue goes through the dialect.

use std::collections::BTreeSet;

use waymark_dialect::{parameter_names, rewrite, specialise};
use waymark_protocol::Statement;

/// Whether `sql` still holds a `(:name::TYPE is null or` head, spacing and
/// case aside.
fn has_null_check(sql: &str, name: &str) -> bool {
    let flat: String = sql.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase();
    let needle = format!("(:{}::", name.to_lowercase());
    flat.match_indices(&needle).any(|(i, _)| {
        let after = &flat[i + needle.len()..];
        after.find(" is null or ").is_some_and(|j| !after[..j].contains(['(', ')', ':']))
    })
}

#[test]
fn catalogue_is_not_empty() {
    assert!(!Statement::ALL.is_empty());
}

#[test]
fn every_statement_rewrites_with_its_declared_params() {
    for s in Statement::ALL {
        let def = s.def();
        let r = rewrite(def.sql).unwrap_or_else(|e| panic!("{}: {e}", def.name()));
        let used: BTreeSet<&str> = r.names().iter().map(String::as_str).collect();
        let declared: BTreeSet<&str> = def.params.iter().map(|p| p.name).collect();
        assert_eq!(used, declared, "{}", def.name());
        assert_eq!(parameter_names(def.sql).unwrap(), r.names(), "{}", def.name());

        let bound: Vec<&str> = def.params.iter().map(|p| p.name).collect();
        let order = r.bind_order(&bound).unwrap_or_else(|e| panic!("{}: {e}", def.name()));
        for (slot, &i) in order.iter().enumerate() {
            assert_eq!(bound[i], r.names()[slot], "{}", def.name());
        }
    }
}

#[test]
fn every_statement_specialises_cleanly() {
    let mut specialised_any = false;
    for s in Statement::ALL {
        let def = s.def();
        assert_eq!(specialise(def.sql, &[]).unwrap(), def.sql, "{}", def.name());

        let all: Vec<&str> = def.params.iter().map(|p| p.name).collect();
        let out = specialise(def.sql, &all).unwrap_or_else(|e| panic!("{}: {e}", def.name()));
        specialised_any |= out != def.sql;
        let r = rewrite(&out).unwrap_or_else(|e| panic!("{}: {e}", def.name()));
        let before: BTreeSet<String> = rewrite(def.sql).unwrap().names().iter().cloned().collect();
        let after: BTreeSet<String> = r.names().iter().cloned().collect();
        assert_eq!(after, before, "{}", def.name());
        r.bind_order(&all).unwrap_or_else(|e| panic!("{}: {e}", def.name()));
        for name in &all {
            assert!(!has_null_check(&out, name), "{}: {name} still null-checked", def.name());
        }
    }
    assert!(specialised_any, "no statement had an optional filter");
}

#[test]
fn list_filters_specialise_one_at_a_time() {
    let def = Statement::from_name("list").unwrap().def();
    assert!(has_null_check(def.sql, "status"));
    let out = specialise(def.sql, &["status"]).unwrap();
    assert!(!has_null_check(&out, "status"));
    assert!(out.contains("(status = :status)"));
    for other in ["queue", "name", "root_id", "correlation_id"] {
        assert!(has_null_check(&out, other), "{other}");
    }
}
