//! Scripts that name a schema. Identifiers cannot be bound as parameters, so
//! these are filled in from templates, and only with names that pass
//! [`is_valid_schema_name`].

const CREATE_SCHEMA: &str = include_str!("../protocol-sql/scripts/create_schema.sql");
const SET_SEARCH_PATH: &str = include_str!("../protocol-sql/scripts/set_search_path.sql");

/// Whether `name` matches `^[A-Za-z_][A-Za-z0-9_$]*$`, the protocol's rule for
/// a schema name. Such a name needs no escaping inside double quotes.
pub fn is_valid_schema_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
}

fn fill(template: &str, schema: &str) -> Option<String> {
    is_valid_schema_name(schema).then(|| template.replace("{schema}", schema))
}

/// `create schema if not exists "<schema>"`, or `None` for an invalid name.
pub fn create_schema_script(schema: &str) -> Option<String> {
    fill(CREATE_SCHEMA, schema)
}

/// `set search_path to "<schema>"`, or `None` for an invalid name.
pub fn set_search_path_script(schema: &str) -> Option<String> {
    fill(SET_SEARCH_PATH, schema)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_follow_the_protocol_rule() {
        for ok in ["a", "_x", "Tenant_1", "a$b", "Z9"] {
            assert!(is_valid_schema_name(ok), "{ok}");
        }
        for bad in ["", "1a", "a-b", "a b", "a\"b", "é", "$a", "a;drop"] {
            assert!(!is_valid_schema_name(bad), "{bad}");
        }
    }

    #[test]
    fn scripts_quote_the_name_and_refuse_bad_ones() {
        let script = create_schema_script("Tenant_1").expect("valid");
        assert!(script.contains("create schema if not exists \"Tenant_1\""));
        assert!(set_search_path_script("x").expect("valid").contains("set search_path to \"x\""));
        assert_eq!(create_schema_script("a\"; drop table t; --"), None);
    }
}
