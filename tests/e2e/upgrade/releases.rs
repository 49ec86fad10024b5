//! Which release is this one and which the previous: the version is one
//! everywhere a shop reads it, and the previous release's binary is built
//! from exactly the commit CHANGELOG.md names.

use super::*;

/// The version is one everywhere a shop reads it: the binary, the newest
/// release in CHANGELOG.md, the Kubernetes image tag and its docs.
#[test]
fn the_version_is_the_changelogs_newest_release_and_the_images_tag() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let version = env!("CARGO_PKG_VERSION");
    let out = output_within(
        Command::new(env!("CARGO_BIN_EXE_order-timeout")).arg("--version"),
        Duration::from_secs(30),
        "order-timeout --version",
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("order-timeout {version}")
    );
    let changelog = std::fs::read_to_string(root.join("CHANGELOG.md")).unwrap();
    let newest = changelog
        .lines()
        .find_map(|l| {
            l.strip_prefix("## [")
                .and_then(|r| r.split(']').next())
                .filter(|v| v.chars().next().is_some_and(|c| c.is_ascii_digit()))
        })
        .expect("a release in CHANGELOG.md");
    assert_eq!(newest, version, "CHANGELOG.md's newest release");
    for (file, needle) in [
        (
            "deploy/kubernetes/kustomization.yaml",
            format!("newTag: \"{version}\""),
        ),
        ("docs/kubernetes.md", format!("order-timeout:{version}")),
    ] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        assert!(text.contains(&needle), "{file} names {needle}");
    }
    // Every release but the newest names its commit, which
    // scripts/previous-release.sh builds.
    let mut release = None;
    for line in changelog.lines() {
        if let Some(v) = line.strip_prefix("## [").and_then(|r| r.split(']').next()) {
            release = Some(v.to_owned());
        } else if let (Some(v), Some(commit)) = (&release, line.strip_prefix("Commit: `")) {
            let sha = commit.trim_end_matches('`');
            assert!(
                sha.len() == 40 && sha.bytes().all(|b| b.is_ascii_hexdigit()),
                "release {v}: a full commit hash, not {sha:?}"
            );
        }
    }
}

/// The release the rolling upgrade starts from is exactly the commit
/// CHANGELOG.md names for it, and that commit is the release: it says the
/// version in `Cargo.toml`, and its CHANGELOG.md holds the entry's lists of
/// changes as they are now (an entry named by a commit that lacked some of
/// them, as 0.2.0's first commit `ea41d19` lacked the layout record, fails
/// here). Every named commit is in this checkout's history and says its
/// version. No build: `scripts/previous-release.sh --which`.
#[test]
fn the_previous_release_is_the_commit_the_changelog_names() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let (version, commit) = previous_version();
    let changelog = std::fs::read_to_string(root.join("CHANGELOG.md")).unwrap();
    let newest_named = changelog
        .split("\n## [")
        .skip(1)
        .find_map(|e| {
            let v = e.split(']').next()?;
            let c = e.lines().find_map(|l| l.strip_prefix("Commit: `"))?;
            Some((v.to_owned(), c.trim_end_matches('`').to_owned()))
        })
        .expect("a release with a Commit: line");
    assert_eq!(
        (version.clone(), commit.clone()),
        newest_named,
        "the newest named release"
    );
    assert_ne!(
        git(&["rev-parse", "HEAD"]).trim(),
        commit,
        "not this checkout"
    );
    assert_eq!(changelog_commit(&version).as_deref(), Some(commit.as_str()));
    // The entry's lists of changes (from its first `###`), then and now.
    let lists = |text: &str| -> String {
        let entry = text
            .split("\n## ")
            .find(|e| e.starts_with(&format!("[{version}]")))
            .unwrap_or_else(|| panic!("no entry for {version}"));
        entry[entry.find("\n### ").expect("lists of changes")..]
            .trim()
            .to_owned()
    };
    let then = git(&["show", &format!("{commit}:CHANGELOG.md")]);
    assert_eq!(
        lists(&then),
        lists(&changelog),
        "{commit} carries {version}'s entry"
    );
    for line in changelog.lines() {
        let Some(named) = line.strip_prefix("Commit: `") else {
            continue;
        };
        let named = named.trim_end_matches('`');
        let manifest = git(&["show", &format!("{named}:Cargo.toml")]);
        let said = manifest
            .lines()
            .find_map(|l| l.strip_prefix("version = \""))
            .map(|v| v.trim_end_matches('"'))
            .expect("a version");
        assert!(
            changelog.contains(&format!("## [{said}]"))
                && changelog_commit(said).as_deref() == Some(named),
            "{named} says version {said}, which CHANGELOG.md does not name it for"
        );
    }
}
