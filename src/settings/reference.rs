//! `config/order-timeout.example.toml` is the reference for configuration:
//! every key the service reads from a file is in it (with its default, or
//! commented out as `# key = value` where it has none), every key in it
//! exists, and it names every environment variable the service reads.
//!
//! The keys are not a list kept by hand: they are read off the code, by
//! driving `Settings`' own `Deserialize` implementation with a deserializer
//! that records the field names each struct asks for ([`code_keys`]). A
//! field added to `Settings` (or to `[orders]`, `[sweeper]`, `[[timers]]`…)
//! without a line in the example fails here, and so does a line for a key
//! that was renamed or removed. The environment variables are read off the
//! source files: every `std::env::var("…")`, `var_os("…")`, `get("…")` of
//! `Settings::apply_env` and clap `env = "…"` attribute.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use serde::de::value::{Error, StrDeserializer};
use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};

use super::Settings;

const EXAMPLE: &str = include_str!("../../config/order-timeout.example.toml");

/// The segment of a path that stands for "an element of this array".
const ELEMENT: &str = "[]";

/// What the code reads at one path of the file.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Node {
    /// A table with these keys (`[retry]`, `[orders]`, the file itself).
    Table(Vec<&'static str>),
    /// A table whose keys are the user's (`[orders.set]`): one key.
    Map,
    /// An array (`lanes`, `also`, `[[timers]]`).
    Array,
    /// A value.
    Value,
}

/// A deserializer that follows `target` (field names, [`ELEMENT`] for an
/// array's element) from the file's root down, and records what the code
/// asks for where the path ends. Everything else is an error, which stops
/// the `Deserialize` implementation early: only the record matters.
struct Tracer<'a> {
    target: &'a [String],
    depth: usize,
    found: &'a RefCell<Option<Node>>,
}

impl<'a> Tracer<'a> {
    fn deeper(&self) -> Self {
        Tracer {
            target: self.target,
            depth: self.depth + 1,
            found: self.found,
        }
    }

    fn at_end(&self) -> bool {
        self.depth == self.target.len()
    }

    /// A value where the path ends; past the end of the path it is not.
    fn leaf(self) -> Result<(), Error> {
        if self.at_end() {
            *self.found.borrow_mut() = Some(Node::Value);
        }
        Err(de::Error::custom("traced"))
    }
}

macro_rules! leaves {
    ($($method:ident),*) => {
        $(fn $method<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Error> {
            self.leaf().map(|()| unreachable!())
        })*
    };
}

impl<'de> de::Deserializer<'de> for Tracer<'_> {
    type Error = Error;

    leaves!(
        deserialize_any,
        deserialize_bool,
        deserialize_i8,
        deserialize_i16,
        deserialize_i32,
        deserialize_i64,
        deserialize_u8,
        deserialize_u16,
        deserialize_u32,
        deserialize_u64,
        deserialize_f32,
        deserialize_f64,
        deserialize_char,
        deserialize_str,
        deserialize_string,
        deserialize_bytes,
        deserialize_byte_buf,
        deserialize_unit,
        deserialize_identifier,
        deserialize_ignored_any
    );

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_some(self)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: V,
    ) -> Result<V::Value, Error> {
        self.leaf().map(|()| unreachable!())
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        if self.at_end() {
            *self.found.borrow_mut() = Some(Node::Array);
            return Err(de::Error::custom("traced"));
        }
        if self.target[self.depth] != ELEMENT {
            return Err(de::Error::custom("an array where the path names a key"));
        }
        visitor.visit_seq(OneElement(Some(self.deeper())))
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Error> {
        if self.at_end() {
            *self.found.borrow_mut() = Some(Node::Map);
        }
        Err(de::Error::custom("traced"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        if self.at_end() {
            *self.found.borrow_mut() = Some(Node::Table(fields.to_vec()));
            return Err(de::Error::custom("traced"));
        }
        let key = self.target[self.depth].clone();
        if !fields.contains(&key.as_str()) {
            return Err(de::Error::custom("no such field"));
        }
        visitor.visit_map(OneField {
            key: Some(key),
            value: Some(self.deeper()),
        })
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Error> {
        self.leaf().map(|()| unreachable!())
    }
}

/// A table with the one key the path goes through.
struct OneField<'a> {
    key: Option<String>,
    value: Option<Tracer<'a>>,
}

impl<'de> MapAccess<'de> for OneField<'_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        match self.key.take() {
            Some(key) => {
                let key: StrDeserializer<'_, Error> = key.as_str().into_deserializer();
                seed.deserialize(key).map(Some)
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let value = self.value.take().expect("one value per key");
        seed.deserialize(value)
    }
}

/// An array with the one element the path goes through.
struct OneElement<'a>(Option<Tracer<'a>>);

impl<'de> SeqAccess<'de> for OneElement<'_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        match self.0.take() {
            Some(element) => seed.deserialize(element).map(Some),
            None => Ok(None),
        }
    }
}

/// Every path of the file the code reads, and what it reads there: each
/// table's fields are followed, and each array's element.
fn code_paths() -> BTreeMap<Vec<String>, Node> {
    let mut found = BTreeMap::new();
    let mut queue: Vec<Vec<String>> = vec![Vec::new()];
    while let Some(path) = queue.pop() {
        let node = RefCell::new(None);
        let _ = Settings::deserialize(Tracer {
            target: &path,
            depth: 0,
            found: &node,
        });
        let node = node
            .into_inner()
            .unwrap_or_else(|| panic!("nothing read at {}", dotted(&path)));
        match &node {
            Node::Table(fields) => {
                for field in fields {
                    queue.push([path.clone(), vec![(*field).to_owned()]].concat());
                }
            }
            Node::Array => queue.push([path.clone(), vec![ELEMENT.to_owned()]].concat()),
            Node::Map | Node::Value => {}
        }
        found.insert(path, node);
    }
    found
}

/// `orders.set`, `timers[].name`.
fn dotted(path: &[String]) -> String {
    path.join(".").replace(".[]", "[]")
}

/// The keys the code reads from a file: every path that is not a table,
/// nor the element of an array of values.
fn code_keys() -> BTreeSet<String> {
    let paths = code_paths();
    let is_table = |path: &[String]| matches!(paths.get(path), Some(Node::Table(_)));
    paths
        .keys()
        .filter(|path| {
            let element = [path.to_vec(), vec![ELEMENT.to_owned()]].concat();
            let array_of_tables = is_table(&element);
            let element_of_values = path.last().is_some_and(|s| s == ELEMENT);
            !is_table(path) && !array_of_tables && !element_of_values
        })
        .map(|path| dotted(path))
        .collect()
}

/// The example with its commented-out keys and tables put back: a line
/// `# key = value`, `# [table]` or `# [[array]]` (a hash, one space, then
/// TOML) is a key shown but not set.
fn uncommented(text: &str) -> String {
    text.lines()
        .map(|line| match line.strip_prefix("# ") {
            Some(rest) if is_key_line(rest) => rest,
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `key = …` with a lowercase key, or a `[table]` / `[[array]]` header.
fn is_key_line(line: &str) -> bool {
    if line.starts_with('[') {
        return line.trim_end().ends_with(']');
    }
    line.split_once(" = ").is_some_and(|(key, _)| {
        !key.is_empty()
            && key
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    })
}

/// The keys a TOML document sets, read as the code reads them (a map's
/// keys are the user's, so the map is one key).
fn document_keys(
    value: &toml::Value,
    path: &mut Vec<String>,
    code: &BTreeMap<Vec<String>, Node>,
    out: &mut BTreeSet<String>,
) {
    let element = [path.clone(), vec![ELEMENT.to_owned()]].concat();
    match (code.get(path.as_slice()), value) {
        (Some(Node::Table(_)), toml::Value::Table(table)) => {
            for (key, value) in table {
                path.push(key.clone());
                if code.contains_key(path.as_slice()) {
                    document_keys(value, path, code, out);
                } else {
                    out.insert(dotted(path));
                }
                path.pop();
            }
        }
        (Some(Node::Array), toml::Value::Array(items))
            if matches!(code.get(&element), Some(Node::Table(_))) =>
        {
            path.push(ELEMENT.to_owned());
            for item in items {
                document_keys(item, path, code, out);
            }
            path.pop();
        }
        _ => {
            out.insert(dotted(path));
        }
    }
}

/// The environment variables the service's source reads: `var("X")`,
/// `var_os("X")`, `get("X")` (`Settings::apply_env`), `env = "X"` (clap),
/// and `RUST_LOG` where a filter is read `from_default_env`.
fn env_vars_in_source() -> BTreeSet<String> {
    fn walk(dir: &std::path::Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    let mut sources = Vec::new();
    walk(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut sources,
    );
    let mut names = BTreeSet::new();
    for source in &sources {
        for opener in ["var(\"", "var_os(\"", "get(\"", "env = \""] {
            for (i, _) in source.match_indices(opener) {
                let rest = &source[i + opener.len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                if name.len() >= 3 && rest[name.len()..].starts_with('"') {
                    names.insert(name);
                }
            }
        }
        if source.contains("from_default_env") {
            names.insert("RUST_LOG".to_owned());
        }
    }
    names
}

/// Variables the example names that the service's libraries read, not its
/// own code: the PostgreSQL driver's TLS settings, as libpq's.
const READ_BY_LIBRARIES: &[&str] = &["PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY"];

/// The variables the example's header names: `#   NAME   what` lines.
fn env_vars_in_example() -> BTreeSet<String> {
    EXAMPLE
        .lines()
        .take_while(|l| l.starts_with('#') || l.is_empty())
        .filter_map(|l| l.strip_prefix("#   "))
        .filter(|l| !l.starts_with(' '))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| {
            w.len() >= 3
                && w.bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_tracer_finds_every_kind_of_key() {
    let keys = code_keys();
    for key in [
        "amqp_url",
        "lanes",
        "retry.max_attempts",
        "sweeper.outbox_retention",
        "orders.paid",
        "orders.set",
        "orders.also",
        "items.quantity",
        "inventory.release",
        "timers[].name",
        "timers[].watch",
    ] {
        assert!(keys.contains(key), "{key} in {keys:?}");
    }
    for not_a_key in ["retry", "orders", "timers", "lanes[]", "admin_token"] {
        assert!(!keys.contains(not_a_key), "{not_a_key} in {keys:?}");
    }
}

#[test]
fn the_example_names_every_key_the_code_reads_and_no_other() {
    let code = code_paths();
    let text = uncommented(EXAMPLE);
    let document: toml::Value = toml::from_str(&text).expect("the uncommented example is TOML");
    let mut documented = BTreeSet::new();
    document_keys(&document, &mut Vec::new(), &code, &mut documented);
    let read = code_keys();
    let missing: Vec<&String> = read.difference(&documented).collect();
    let unknown: Vec<&String> = documented.difference(&read).collect();
    assert!(
        missing.is_empty(),
        "keys the code reads that config/order-timeout.example.toml does not show \
         (add them, with their default, or as `# key = value`): {missing:?}"
    );
    assert!(
        unknown.is_empty(),
        "keys config/order-timeout.example.toml shows that the code does not read: {unknown:?}"
    );
    // And as the service reads it: every key known, every value valid.
    let settings: Settings = toml::from_str(&text).expect("the uncommented example parses");
    settings
        .validate()
        .expect("the uncommented example is valid");
    settings.timers().expect("its timers are valid");
}

#[test]
fn the_example_names_every_environment_variable() {
    let read = env_vars_in_source();
    for expected in [
        "AMQP_URL",
        "DATABASE_URL",
        "ADMIN_TOKEN",
        "LOG_FORMAT",
        "RUST_LOG",
    ] {
        assert!(read.contains(expected), "{expected} in {read:?}");
    }
    let named = env_vars_in_example();
    let missing: Vec<&String> = read.difference(&named).collect();
    assert!(
        missing.is_empty(),
        "environment variables the code reads that the example's header does not name \
         (a `#   NAME  what it does` line): {missing:?}"
    );
    let unknown: Vec<&String> = named
        .iter()
        .filter(|n| !read.contains(*n) && !READ_BY_LIBRARIES.contains(&n.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "the example names environment variables nothing reads: {unknown:?}"
    );
}

#[test]
fn a_key_missing_from_a_document_is_found() {
    // The comparison itself: a document without `retry.max_attempts`
    // and with a made-up key differs from the code in both directions.
    let code = code_paths();
    let document: toml::Value =
        toml::from_str("[retry]\nbase_delay = \"1s\"\nmade_up = 1\n").unwrap();
    let mut documented = BTreeSet::new();
    document_keys(&document, &mut Vec::new(), &code, &mut documented);
    assert!(documented.contains("retry.made_up"), "{documented:?}");
    assert!(!documented.contains("retry.max_attempts"));
    assert!(code_keys().contains("retry.max_attempts"));
}
