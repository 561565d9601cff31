//! Strict decoding, as `kubectl apply` with server-side field validation and the API server's
//! CRD schemas decode: for objects read from files, which nothing has validated yet.
//!
//! A field is unknown when it does not survive a decode → encode round trip: every key of the
//! input whose path is absent from the re-encoded object was dropped by the decoder. `null`
//! values are tolerated (they mean "absent"), and fields typed as arbitrary JSON round-trip
//! whole. A type error names the field's path ([`serde_path_to_error`]). The enum-like strings the
//! Istio CRDs restrict are checked by [`crate::Object`] afterwards ([`check_enum`]).
//!
//! Objects from the Kubernetes API are decoded leniently: the API server validated them already,
//! and a newer Istio adds fields Ambit does not know.

use std::fmt;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// How a document is decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decoding {
    /// Unknown fields are ignored and enum-like values are not checked (the Kubernetes API
    /// source: the API server validated the object already).
    Lenient,
    /// Unknown fields and unsupported enum values are refused, and errors name the field (files).
    Strict,
}

/// One step of a [`FieldPath`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// A mapping key.
    Key(String),
    /// A sequence index.
    Index(usize),
}

/// Where a field is in an object: shown `spec.rules[0].from[0].source`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldPath(pub Vec<Step>);

impl FieldPath {
    fn with(&self, step: Step) -> FieldPath {
        let mut steps = self.0.clone();
        steps.push(step);
        FieldPath(steps)
    }

    /// A path of keys (`["spec", "action"]` is `spec.action`).
    pub fn keys(keys: &[&str]) -> FieldPath {
        FieldPath(keys.iter().map(|k| Step::Key((*k).to_owned())).collect())
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, step) in self.0.iter().enumerate() {
            match step {
                Step::Key(k) if i == 0 => f.write_str(k)?,
                Step::Key(k) => write!(f, ".{k}")?,
                Step::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// What is wrong with one field of an object (worded as kubectl and the API server word it).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FieldError {
    /// A field the kind does not have.
    #[error("unknown field \"{path}\"{}", hint.as_ref().map(|h| format!(" (did you mean \"{h}\"?)")).unwrap_or_default())]
    Unknown {
        /// The field.
        path: FieldPath,
        /// A known field of the same object with a close name.
        hint: Option<String>,
    },
    /// A value outside the field's enumeration.
    #[error("{path}: Unsupported value: {value:?}: supported values: {}", quoted(supported))]
    Unsupported {
        /// The field.
        path: FieldPath,
        /// The value written.
        value: String,
        /// The values the field takes.
        supported: &'static [&'static str],
    },
    /// A value of the wrong type (or otherwise refused by the decoder).
    #[error("{}{message}", if path.0.is_empty() { String::new() } else { format!("{path}: ") })]
    Invalid {
        /// The field (empty: the object itself).
        path: FieldPath,
        /// The decoder's message.
        message: String,
    },
}

fn quoted(values: &[&str]) -> String {
    values.iter().map(|v| format!("{v:?}")).collect::<Vec<_>>().join(", ")
}

impl FieldError {
    /// The field.
    pub fn path(&self) -> &FieldPath {
        match self {
            FieldError::Unknown { path, .. }
            | FieldError::Unsupported { path, .. }
            | FieldError::Invalid { path, .. } => path,
        }
    }

    /// Whether the error is about the field's name (its key is where it is) rather than its value.
    pub fn is_about_the_key(&self) -> bool {
        matches!(self, FieldError::Unknown { .. })
    }
}

/// Decodes `value` as a `T`. Strictly: the first field that does not survive the round trip,
/// or the path of a type error.
pub fn decode<T: DeserializeOwned + Serialize>(value: &Value, decoding: Decoding) -> Result<T, FieldError> {
    let decoded: T = match decoding {
        Decoding::Lenient => T::deserialize(value)
            .map_err(|e| FieldError::Invalid { path: FieldPath::default(), message: e.to_string() })?,
        Decoding::Strict => serde_path_to_error::deserialize(value)
            .map_err(|e| FieldError::Invalid { path: path_of(e.path()), message: e.inner().to_string() })?,
    };
    if decoding == Decoding::Strict {
        let encoded = serde_json::to_value(&decoded)
            .map_err(|e| FieldError::Invalid { path: FieldPath::default(), message: e.to_string() })?;
        if let Some(e) = unknown(value, &encoded, &FieldPath::default()) {
            return Err(e);
        }
    }
    Ok(decoded)
}

fn path_of(path: &serde_path_to_error::Path) -> FieldPath {
    use serde_path_to_error::Segment;
    FieldPath(
        path.iter()
            .filter_map(|s| match s {
                Segment::Seq { index } => Some(Step::Index(*index)),
                Segment::Map { key } => Some(Step::Key(key.clone())),
                Segment::Enum { variant } => Some(Step::Key(variant.clone())),
                Segment::Unknown => None,
            })
            .collect(),
    )
}

/// The first key of `input` (in its order) that `encoded` lacks, at `path`.
fn unknown(input: &Value, encoded: &Value, path: &FieldPath) -> Option<FieldError> {
    match (input, encoded) {
        (Value::Object(input), Value::Object(encoded)) => {
            for (key, value) in input {
                if value.is_null() {
                    continue;
                }
                // Every object names its kind; Ambit's own Istio types do not re-encode it.
                if path.0.is_empty() && (key == "apiVersion" || key == "kind") {
                    continue;
                }
                let here = path.with(Step::Key(key.clone()));
                match encoded.get(key) {
                    Some(e) => {
                        if let Some(error) = unknown(value, e, &here) {
                            return Some(error);
                        }
                    }
                    None => {
                        let hint = closest(key, encoded.keys().filter(|k| !input.contains_key(*k)));
                        return Some(FieldError::Unknown { path: here, hint });
                    }
                }
            }
            None
        }
        (Value::Array(input), Value::Array(encoded)) => input
            .iter()
            .zip(encoded)
            .enumerate()
            .find_map(|(i, (v, e))| unknown(v, e, &path.with(Step::Index(i)))),
        _ => None,
    }
}

/// The known name closest to `key`, if one is at most two edits away (and `key` is not tiny).
fn closest<'a>(key: &str, known: impl Iterator<Item = &'a String>) -> Option<String> {
    let mut best: Option<(usize, &String)> = None;
    for k in known {
        let d = distance(&key.to_ascii_lowercase(), &k.to_ascii_lowercase());
        if d <= 2 && d < key.len().min(k.len()) && best.is_none_or(|(b, _)| d < b) {
            best = Some((d, k));
        }
    }
    best.map(|(_, k)| k.clone())
}

/// Levenshtein distance.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = if ca == *cb { prev } else { 1 + prev.min(row[j]).min(cur) };
            prev = cur;
        }
    }
    row[b.len()]
}

/// `value` must be one of `supported`; empty means absent (the proto default).
pub fn check_enum(path: &[&str], value: &str, supported: &'static [&'static str]) -> Result<(), FieldError> {
    if value.is_empty() || supported.contains(&value) {
        return Ok(());
    }
    Err(FieldError::Unsupported { path: FieldPath::keys(path), value: value.to_owned(), supported })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_dotted_with_indices() {
        let p = FieldPath(vec![
            Step::Key("spec".into()),
            Step::Key("rules".into()),
            Step::Index(0),
            Step::Key("from".into()),
            Step::Index(1),
        ]);
        assert_eq!(p.to_string(), "spec.rules[0].from[1]");
    }

    #[test]
    fn hints_only_close_names() {
        let known = ["rules".to_owned(), "action".to_owned(), "selector".to_owned()];
        assert_eq!(closest("rulez", known.iter()), Some("rules".to_owned()));
        assert_eq!(closest("Action", known.iter()), Some("action".to_owned()));
        assert_eq!(closest("banana", known.iter()), None);
        assert_eq!(distance("kitten", "sitting"), 3);
    }
}
