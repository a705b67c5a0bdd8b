//! Reading a run configuration: the TOML file, `--set key=value` overrides on its table, the
//! `[model]` table resolved, then the schema and the checks — every error naming the file (or
//! the `--set` argument) and the key.

use std::path::Path;

use super::error::ConfigError;
use super::model::resolve_model;
use super::schema::{set_key_parts, Origin, Override, RunConfig, VocabSource};

impl RunConfig {
    /// Reads `path`, applies `overrides` (`key=value`, dotted keys, TOML values; a value that
    /// is not TOML is taken as a string), resolves the model preset, and validates.
    ///
    /// Errors: unreadable file, bad TOML, unknown key, missing key, bad value, unknown preset —
    /// each naming the file and the key.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self, ConfigError> {
        Self::load_with(path, &Override::sets(overrides))
    }

    /// [`RunConfig::load`] with overrides that carry how the user gave them (a flag such as
    /// `--nodes 2` that sets `parallel.nodes=2`), each named so in errors.
    ///
    /// Errors: as [`RunConfig::load`].
    pub fn load_with(path: &Path, overrides: &[Override]) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|error| ConfigError::Read { path: path.into(), error })?;
        Self::from_toml_str_with(&text, path, overrides)
    }

    /// Like [`RunConfig::load`] from TOML text; `path` names the source in errors and is kept
    /// in [`RunConfig::origin`].
    pub fn from_toml_str(text: &str, path: &Path, overrides: &[String]) -> Result<Self, ConfigError> {
        Self::from_toml_str_with(text, path, &Override::sets(overrides))
    }

    /// [`RunConfig::from_toml_str`] with labelled overrides (see [`RunConfig::load_with`]).
    pub fn from_toml_str_with(text: &str, path: &Path, overrides: &[Override]) -> Result<Self, ConfigError> {
        let mut table: toml::Table = text.parse().map_err(|e: toml::de::Error| ConfigError::Syntax {
            path: path.into(),
            message: e.to_string(),
        })?;
        for o in overrides {
            apply_override(&mut table, o)?;
        }
        // A bad value set with --set is reported as such, not as the file's.
        let origin = Origin { path: path.into(), overrides: overrides.to_vec(), vocab: VocabSource::Given };
        let key_err = |key: &str, message: String| {
            origin.at(key, plain_serde_message(message.lines().next().unwrap_or_default().trim()))
        };
        let (model, vocab) = match table.remove("model") {
            Some(toml::Value::Table(model)) => resolve_model(model).map_err(|(k, m)| key_err(&k, m))?,
            Some(_) => return Err(key_err("model", "must be a table ([model])".into())),
            None => return Err(key_err("model", "missing: add a [model] table".into())),
        };
        let model = toml::Table::try_from(&model).expect("a model config serializes to a TOML table");
        table.insert("model".into(), toml::Value::Table(model));
        let mut config: RunConfig =
            serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
                let (key, message) = (e.path().to_string(), e.inner().to_string());
                // serde names a missing top-level key only in its message: "missing field `x`".
                let missing = message.strip_prefix("missing field `").and_then(|m| m.split('`').next());
                match (key.as_str(), missing) {
                    (".", Some(field)) => key_err(field, "missing: this key is required".into()),
                    (".", None) => key_err("(top level)", message),
                    _ => key_err(&key, message),
                }
            })?;
        config.origin = Origin { vocab, ..origin.clone() };
        config.validate().map_err(|e| {
            let keys: Vec<&str> =
                std::iter::once(e.key.as_str()).chain(e.related.iter().map(String::as_str)).collect();
            origin.at_any(&keys, e.message)
        })?;
        if config.optimizer.lr_decay_steps.is_none() {
            config.optimizer.lr_decay_steps = Some(config.max_steps);
        }
        Ok(config)
    }
}

/// Applies one `key=value` override to the raw TOML table.
fn apply_override(table: &mut toml::Table, o: &Override) -> Result<(), ConfigError> {
    let arg = o.set.as_str();
    let set_err = |message: &str| ConfigError::Set { arg: o.shown(), message: message.into() };
    let (key, raw) = arg.split_once('=').ok_or_else(|| set_err("expected key=value, e.g. max_steps=100"))?;
    let mut parts = set_key_parts(key);
    if parts.iter().any(|part| part.is_empty()) {
        return Err(set_err("empty key; expected a dotted key such as optimizer.lr"));
    }
    // A TOML value if it parses as one (numbers, booleans, quoted strings, arrays), else a string.
    let value = format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()));
    let last = parts.pop().expect("split yields at least one part");
    let mut node = table;
    for part in parts {
        let entry = node.entry(part).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        node = entry.as_table_mut().ok_or_else(|| set_err(&format!("`{part}` is not a table")))?;
    }
    node.insert(last.to_string(), value);
    Ok(())
}

/// serde's "invalid type: string \"abc\", expected usize" as "expected a non-negative integer,
/// found \"abc\"" (Rust type names become words), and its message for `devices` in words;
/// other messages are returned as they are.
fn plain_serde_message(message: &str) -> String {
    if message == "data did not match any variant of untagged enum Devices" {
        return "expected a number of replicas (1 or more) or a list of CUDA device indices such as [0, 1]"
            .to_string();
    }
    let Some((found, expected)) = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "))
        .and_then(|m| m.split_once(", expected "))
    else {
        return message.to_string();
    };
    let expected = match expected {
        "u16" => "an integer from 0 to 65535",
        "u8" => "an integer from 0 to 255",
        "usize" | "u64" | "u32" => "a non-negative integer",
        "isize" | "i64" | "i32" | "i16" | "i8" => "an integer",
        "f64" | "f32" => "a number",
        other => other,
    };
    // "string \"abc\"" -> "\"abc\"", "integer `-5`" -> "-5", "floating point `1.5`" -> "1.5".
    let found = match found.split_once(' ') {
        Some(("string", value)) => value.to_string(),
        _ => match found.rsplit_once(" `") {
            Some((kind, value)) if value.ends_with('`') && !kind.contains('`') => {
                value.trim_end_matches('`').to_string()
            }
            _ => found.to_string(),
        },
    };
    // A --set number beyond TOML's integers arrives as a string of digits.
    let digits = found.trim_matches('"');
    let beyond_toml = digits.bytes().all(|b| b.is_ascii_digit())
        && (digits.len() > 19 || digits.parse::<u64>().is_ok_and(|v| v > i64::MAX as u64));
    if expected.contains("integer") && beyond_toml {
        return format!("expected {expected} up to 9223372036854775807 (TOML's largest), found {digits}");
    }
    format!("expected {expected}, found {found}")
}

#[cfg(test)]
mod message_tests {
    use super::plain_serde_message as plain;

    #[test]
    fn serde_type_errors_say_what_was_expected_in_words() {
        let cases = [
            (
                r#"invalid type: string "abc", expected usize"#,
                r#"expected a non-negative integer, found "abc""#,
            ),
            ("invalid value: integer `-5`, expected usize", "expected a non-negative integer, found -5"),
            (
                "invalid type: floating point `1.5`, expected u64",
                "expected a non-negative integer, found 1.5",
            ),
            (r#"invalid type: string "fast", expected f64"#, r#"expected a number, found "fast""#),
            ("invalid type: integer `1`, expected a boolean", "expected a boolean, found 1"),
            (r#"invalid type: string "128", expected usize"#, r#"expected a non-negative integer, found "128""#),
            (
                r#"invalid type: string "18446744073709551615", expected u64"#,
                "expected a non-negative integer up to 9223372036854775807 (TOML's largest), found 18446744073709551615",
            ),
            ("invalid type: sequence, expected a string", "expected a string, found sequence"),
            ("unknown field `x`", "unknown field `x`"),
            (
                "data did not match any variant of untagged enum Devices",
                "expected a number of replicas (1 or more) or a list of CUDA device indices such as [0, 1]",
            ),
        ];
        for (serde, ours) in cases {
            assert_eq!(plain(serde), ours);
        }
    }
}
