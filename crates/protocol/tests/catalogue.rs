//! The catalogue and the files on disk must name the same statements and
//! migrations, and every header must parse.

use std::collections::BTreeSet;
use std::path::Path;

use waymark_protocol::{ledger_migrations, migrations, Statement};

fn sql_files(dir: &str) -> BTreeSet<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("protocol-sql").join(dir);
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("dir entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".sql"))
        .collect()
}

#[test]
fn every_statement_file_is_catalogued_and_the_reverse() {
    let on_disk = sql_files("statements");
    let catalogued: BTreeSet<String> = Statement::ALL.iter().map(|s| s.def().file_name()).collect();
    let missing: Vec<_> = on_disk.difference(&catalogued).collect();
    let phantom: Vec<_> = catalogued.difference(&on_disk).collect();
    assert!(missing.is_empty(), "files not in the catalogue: {missing:?}");
    assert!(phantom.is_empty(), "catalogued without a file: {phantom:?}");
}

#[test]
fn every_migration_file_is_listed_in_order_and_the_reverse() {
    let on_disk: Vec<String> = sql_files("migrations").into_iter().collect();
    let listed: Vec<String> = migrations().iter().map(|m| m.name.to_owned()).collect();
    assert_eq!(on_disk, listed);
    for (i, m) in migrations().iter().enumerate() {
        assert_eq!(m.number() as usize, i + 1, "{} is out of sequence", m.name);
    }
}

#[test]
fn every_ledger_migration_file_is_listed_in_order_and_the_reverse() {
    let on_disk: Vec<String> = sql_files("ledgers").into_iter().collect();
    let listed: Vec<String> = ledger_migrations().iter().map(|m| m.name.to_owned()).collect();
    assert_eq!(on_disk, listed);
    for (i, m) in ledger_migrations().iter().enumerate() {
        assert_eq!(m.number() as usize, i + 1, "{} is out of sequence", m.name);
        assert!(!m.sql.contains("cairnq_meta"), "{} must leave cairnq's versions alone", m.name);
    }
}

#[test]
fn headers_parse_and_names_are_unique() {
    for s in Statement::ALL {
        let def = s.def();
        let mut seen = BTreeSet::new();
        for p in &def.params {
            assert!(seen.insert(p.name), "{}: parameter {} declared twice", def.name(), p.name);
        }
        assert_eq!(Statement::from_name(def.name()), Some(*s));
    }
}

#[test]
fn migrations_set_schema_version_to_their_number() {
    for m in migrations() {
        let expected = format!("set value = '{}' where key = 'schema_version'", m.number());
        match m.number() {
            1 => assert!(m.sql.contains("('schema_version', '1')")),
            3 => assert!(!m.sql.contains("schema_version'"), "0003 must not touch schema_version"),
            _ => assert!(m.sql.contains(&expected), "{} must set schema_version", m.name),
        }
    }
}

#[test]
fn no_migration_builds_concurrently() {
    for m in migrations() {
        assert!(!m.sql.to_lowercase().contains("concurrently"), "{} uses CONCURRENTLY", m.name);
    }
}
