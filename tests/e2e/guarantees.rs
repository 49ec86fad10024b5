//! docs/guarantees.md cites only tests that exist: every test name, module
//! path and file it names in backticks is looked up in the sources, so a
//! renamed or removed test cannot leave a guarantee pointing at nothing.
//!
//! What counts as a citation: a `path.rs` (optionally `::test_name`), a
//! Rust path `module::…::name` whose segments are lower case, and a bare
//! snake_case name of four words or more (shorter ones are config keys;
//! `order_timeout_*` names are metrics and tables). A name with `…` in it
//! stands for several and is skipped.

use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Whether `text` defines a function or module `name`.
fn defines(text: &str, name: &str) -> bool {
    [
        format!("fn {name}("),
        format!("fn {name}<"),
        format!("mod {name} "),
    ]
    .iter()
    .any(|d| text.contains(d.as_str()))
        || text.contains(&format!("mod {name} {{"))
}

/// The spans between backticks of `text`.
fn backticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

fn snake_words(token: &str) -> Option<usize> {
    let ok = !token.is_empty()
        && token
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    ok.then(|| token.split('_').filter(|w| !w.is_empty()).count())
}

/// What a citation names that does not exist, if anything.
fn missing(token: &str, sources: &[(PathBuf, String)]) -> Option<String> {
    if token.contains('…') || token.contains(' ') {
        return None;
    }
    let defined_anywhere = |name: &str| sources.iter().any(|(_, text)| defines(text, name));
    if let Some((file, rest)) = token
        .split_once(".rs")
        .filter(|(file, _)| file.contains('/') || !file.contains("::"))
    {
        // `tests/e2e/x.rs`, `tests/e2e/x.rs::name`, `x.rs::name`.
        let candidates = [
            root().join(format!("{file}.rs")),
            root().join(format!("tests/e2e/{file}.rs")),
        ];
        let Some(path) = candidates.iter().find(|p| p.is_file()) else {
            return Some(format!("no file {file}.rs"));
        };
        let name = rest.trim_start_matches("::");
        if name.is_empty() {
            return None;
        }
        let text = std::fs::read_to_string(path).unwrap();
        return (!defines(&text, name)).then(|| format!("no fn {name} in {}", path.display()));
    }
    if token.contains("::") {
        let segments: Vec<&str> = token.split("::").collect();
        if segments.iter().any(|s| snake_words(s).is_none()) {
            return None; // `u64::MAX`, a type's path
        }
        let name = segments[segments.len() - 1];
        return (!defined_anywhere(name)).then(|| format!("no fn or mod {name}"));
    }
    match snake_words(token) {
        Some(words) if words >= 4 && !token.starts_with("order_timeout_") => {
            (!defined_anywhere(token)).then(|| format!("no fn {token}"))
        }
        _ => None,
    }
}

#[test]
fn every_test_cited_exists() {
    let doc = std::fs::read_to_string(root().join("docs/guarantees.md")).unwrap();
    let mut files = Vec::new();
    for dir in ["src", "tests", "tools/src"] {
        rust_files(&root().join(dir), &mut files);
    }
    let sources: Vec<(PathBuf, String)> = files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect();
    let cited: Vec<&str> = backticked(&doc);
    assert!(cited.len() > 50, "the page cites tests: {}", cited.len());
    let wrong: Vec<String> = cited
        .iter()
        .filter_map(|token| Some(format!("`{token}`: {}", missing(token, &sources)?)))
        .collect();
    assert!(
        wrong.is_empty(),
        "docs/guarantees.md cites what does not exist:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn a_citation_of_nothing_is_found() {
    let sources = vec![(
        PathBuf::from("x.rs"),
        "fn a_test_that_exists_here() {}\nmod some_module {}".to_owned(),
    )];
    for (token, found) in [
        ("a_test_that_exists_here", true),
        ("a_test_that_was_renamed_away", false),
        ("some_module::a_test_that_exists_here", true),
        ("some_module::gone_away_test_name", false),
        ("tests/e2e/guarantees.rs", true),
        ("tests/e2e/no_such_file.rs", false),
        ("tests/e2e/guarantees.rs::every_test_cited_exists", true),
        ("tests/e2e/guarantees.rs::snake_words_renamed", false),
        ("guarantees.rs::every_test_cited_exists", true),
        ("batch_max", true),
        ("order_timeout_sweeps_total", true),
        ("…_flips_the_guard_column", true),
        ("u64::MAX", true),
    ] {
        assert_eq!(missing(token, &sources).is_none(), found, "{token}");
    }
}
