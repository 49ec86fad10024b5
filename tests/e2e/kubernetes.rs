//! The Kubernetes manifests in `deploy/kubernetes/`, validated offline:
//! `scripts/check-kubernetes-manifests.py` checks every resource strictly
//! against the Kubernetes schemas kubernetes-validate bundles (installed by
//! `scripts/ensure-services.sh --ops-tools`), the PrometheusRule against
//! the promtool-tested rules, and the manifests against each other; here,
//! the ConfigMap's config file is also read by the service's own settings
//! code, and a broken manifest is shown to fail the check.

use std::path::{Path, PathBuf};
use std::process::Command;

use order_timeout::settings::Settings;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The virtualenv's python that has kubernetes-validate, where
/// `scripts/ensure-services.sh --ops-tools` puts it.
fn python() -> PathBuf {
    let venv = std::env::var_os("KUBERNETES_VALIDATE_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            let script = std::fs::read_to_string(root().join("scripts/ensure-services.sh"))
                .expect("scripts/ensure-services.sh");
            let version = script
                .lines()
                .find_map(|l| l.strip_prefix("KUBERNETES_VALIDATE_VERSION="))
                .expect("ensure-services.sh pins KUBERNETES_VALIDATE_VERSION");
            Path::new(&home)
                .join(".cache/order-timeout")
                .join(format!("kubernetes-validate-{version}"))
        });
    let python = venv.join("bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/ensure-services.sh --ops-tools (installs kubernetes-validate)",
        python.display()
    );
    python
}

/// Runs the checker on `manifests`: `(success, output)`.
fn check(manifests: &Path) -> (bool, String) {
    let out = crate::bounds::output_within(
        Command::new(python())
            .arg(root().join("scripts/check-kubernetes-manifests.py"))
            .arg("--manifests")
            .arg(manifests),
        std::time::Duration::from_secs(300),
        "scripts/check-kubernetes-manifests.py",
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn the_manifests_validate_against_kubernetes_schemas_offline() {
    let (ok, out) = check(&root().join("deploy/kubernetes"));
    assert!(ok, "{out}");
    assert!(out.contains("ok: "), "{out}");
    assert!(
        out.contains("1.37.0"),
        "validated against a current Kubernetes: {out}"
    );
}

#[test]
fn a_broken_manifest_fails_the_check() {
    let dir = std::env::temp_dir().join(format!("ot-k8s-{}", uuid::Uuid::new_v4().simple()));
    copy_dir(&root().join("deploy/kubernetes"), &dir);
    let deployment = dir.join("deployment.yaml");
    let text = std::fs::read_to_string(&deployment).unwrap();
    // A misspelt field (the schema rejects it) and a grace period shorter
    // than the service's shutdown (the cross-check does).
    let broken = text.replace("readinessProbe:", "readinesProbe:").replace(
        "terminationGracePeriodSeconds: 45",
        "terminationGracePeriodSeconds: 20",
    );
    assert_ne!(broken, text);
    std::fs::write(&deployment, broken).unwrap();
    let (ok, out) = check(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!ok, "{out}");
    assert!(out.contains("'readinesProbe' was unexpected"), "{out}");
    assert!(out.contains("terminationGracePeriodSeconds 20"), "{out}");
}

#[test]
fn the_configmaps_config_file_is_valid_for_the_service() {
    let configmap =
        std::fs::read_to_string(root().join("deploy/kubernetes/configmap.yaml")).unwrap();
    // The literal block under `order-timeout.toml: |`, four spaces in.
    let toml: String = configmap
        .split_once("order-timeout.toml: |\n")
        .expect("the ConfigMap holds order-timeout.toml")
        .1
        .lines()
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l)))
        .collect();
    let settings: Settings = toml::from_str(&toml).unwrap_or_else(|e| panic!("{e}\n{toml}"));
    settings.validate().unwrap();
    settings.timers().unwrap();
    assert!(!settings.lanes.is_empty(), "{toml}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}
