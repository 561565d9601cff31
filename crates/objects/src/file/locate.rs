//! Where a field is written: the file parsed again into a tree of positions (only when an error
//! needs one), then walked along the field's path.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

use super::{Origin, Position, options, start};
use crate::strict::{FieldError, Step};

/// A YAML node, with the positions of what it holds.
enum Node {
    Scalar,
    Seq(Vec<Spanned<Node>>),
    Map(Vec<(Spanned<Key>, Spanned<Node>)>),
}

/// A mapping key, as text (`9090:` is the key `9090`).
struct Key(String);

/// The position of the field `error` is about in the value from `origin`, if `text` still has
/// that document: the deepest node of the field's path that is written.
pub(super) fn find(text: &str, origin: &Origin, error: &FieldError) -> Option<Position> {
    let docs: Vec<Spanned<Node>> = serde_saphyr::from_multiple_with_options(text, options()).ok()?;
    let doc = docs.iter().find(|d| start(&d.referenced) == origin.at)?;
    let mut node = doc;
    let mut at = origin.at;
    for index in &origin.items {
        let items = entry(&node.value, "items")?;
        let Node::Seq(list) = &items.1.value else { return None };
        node = list.get(*index)?;
        at = position(node);
    }
    let steps = &error.path().0;
    for (i, step) in steps.iter().enumerate() {
        let last = i + 1 == steps.len();
        let next = match (step, &node.value) {
            (Step::Key(k), _) => match entry(&node.value, k) {
                Some((key, value)) => {
                    if last && error.is_about_the_key() {
                        return Some(position(key));
                    }
                    value
                }
                None => break,
            },
            (Step::Index(n), Node::Seq(list)) => match list.get(*n) {
                Some(v) => v,
                None => break,
            },
            _ => break,
        };
        node = next;
        at = position(node);
    }
    Some(at)
}

fn entry<'a>(node: &'a Node, key: &str) -> Option<&'a (Spanned<Key>, Spanned<Node>)> {
    match node {
        Node::Map(entries) => entries.iter().find(|(k, _)| k.value.0 == key),
        _ => None,
    }
}

fn position<T>(s: &Spanned<T>) -> Position {
    start(&s.referenced)
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Node, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any YAML node")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Node, E> {
        Ok(Node::Scalar)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }

    fn visit_i128<E: de::Error>(self, _: i128) -> Result<Node, E> {
        Ok(Node::Scalar)
    }

    fn visit_u128<E: de::Error>(self, _: u128) -> Result<Node, E> {
        Ok(Node::Scalar)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Node, E> {
        Ok(Node::Scalar)
    }

    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<Node, E> {
        Ok(Node::Scalar)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Scalar)
    }

    fn visit_none<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Scalar)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut list = Vec::new();
        while let Some(item) = seq.next_element::<Spanned<Node>>()? {
            list.push(item);
        }
        Ok(Node::Seq(list))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Spanned<Key>>()? {
            let value = map.next_value::<Spanned<Node>>()?;
            entries.push((key, value));
        }
        Ok(Node::Map(entries))
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        d.deserialize_any(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a mapping key")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
        Ok(Key(v.to_owned()))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Key, E> {
        Ok(Key(String::new()))
    }

    fn visit_none<E: de::Error>(self) -> Result<Key, E> {
        Ok(Key(String::new()))
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        Key::deserialize(d)
    }

    // A key that is a collection is never a field name: it is kept, unnamed.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Key, A::Error> {
        while seq.next_element::<de::IgnoredAny>()?.is_some() {}
        Ok(Key(String::new()))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Key, A::Error> {
        while map.next_entry::<de::IgnoredAny, de::IgnoredAny>()?.is_some() {}
        Ok(Key(String::new()))
    }
}
