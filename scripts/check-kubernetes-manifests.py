#!/usr/bin/env python3
"""Checks deploy/kubernetes/ offline; the test suite runs it (tests/e2e/kubernetes.rs).

1. Every resource validates strictly (unknown fields are errors) against the Kubernetes
   OpenAPI schemas that kubernetes-validate bundles, for each --kubernetes-version.
   kubernetes-validate is installed by `scripts/ensure-services.sh --ops-tools` into a
   virtualenv; run this script with that virtualenv's python.
2. The Prometheus Operator resources (not in those schemas) are checked here: the
   PrometheusRule holds exactly the groups of deploy/prometheus-alerts.yml (the rules
   promtool tests), the ServiceMonitor selects the Service and names one of its ports.
3. The manifests agree with each other and with the service: probes on /healthz and
   /readyz of the port HTTP_ADDR listens on, a termination grace period longer than the
   config's shutdown_timeout, Secret keys and ConfigMaps that exist, the migrate Job
   running `migrate`, selectors that select the serving pods, every manifest listed in
   its kustomization.yaml, and a NetworkPolicy that admits the serving pods' http port
   only from named sources (never from everywhere) and no other port.

Usage: check-kubernetes-manifests.py [--manifests DIR] [--kubernetes-version V]...
       check-kubernetes-manifests.py --write-prometheusrule   (after changing the rules)
"""

import argparse
import pathlib
import re
import sys
import tomllib

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
ALERTS = ROOT / "deploy" / "prometheus-alerts.yml"
DEFAULT_VERSIONS = ["1.37.0", "1.30.0"]
RULE_HEADER = """\
# GENERATED from deploy/prometheus-alerts.yml by
#   scripts/check-kubernetes-manifests.py --write-prometheusrule
# (the test suite fails when the two differ). The same alert rules, unit-tested with
# promtool, as a Prometheus Operator PrometheusRule. What to do when each fires:
# docs/operator-tooling.md, "Alerts".
"""


def prometheus_rule():
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "order-timeout",
            "labels": {"app.kubernetes.io/name": "order-timeout", "release": "prometheus"},
        },
        "spec": {"groups": groups},
    }


def load(directory):
    """Every resource of every manifest under `directory`, with its file."""
    out = []
    for path in sorted(directory.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((path, doc))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--manifests", type=pathlib.Path, default=ROOT / "deploy" / "kubernetes")
    parser.add_argument("--kubernetes-version", action="append", dest="versions")
    parser.add_argument("--write-prometheusrule", action="store_true")
    args = parser.parse_args()
    rule_path = args.manifests / "monitoring" / "prometheusrule.yaml"
    if args.write_prometheusrule:
        text = yaml.safe_dump(prometheus_rule(), sort_keys=False, width=100, allow_unicode=True)
        rule_path.write_text(RULE_HEADER + text)
        print(f"wrote {rule_path}")
        return 0

    import kubernetes_validate.utils as kv

    errors = []
    resources = load(args.manifests)
    by_kind = {}
    for path, doc in resources:
        by_kind.setdefault(doc.get("kind"), []).append((path, doc))

    # 1. The Kubernetes schemas, strictly.
    versions = args.versions or DEFAULT_VERSIONS
    validated = 0
    for path, doc in resources:
        api = doc.get("apiVersion", "")
        if api.startswith("kustomize.config.k8s.io/") or api.startswith("monitoring.coreos.com/"):
            continue
        for version in versions:
            try:
                kv.validate(doc, version, strict=True)
                validated += 1
            except kv.ValidationError as e:
                where = ".".join(str(p) for p in e.path)
                errors.append(f"{path.name}: {doc['kind']} {doc['metadata']['name']} (Kubernetes {version}): {where}: {e.message}")
            except kv.SchemaNotFoundError as e:
                errors.append(f"{path.name}: {e.message}")

    def one(kind):
        items = by_kind.get(kind, [])
        if len(items) != 1:
            errors.append(f"expected one {kind}, found {len(items)}")
            return {}
        return items[0][1]

    deployment = one("Deployment")
    job = one("Job")
    service = one("Service")
    pdb = one("PodDisruptionBudget")
    configmap = one("ConfigMap")
    monitor = one("ServiceMonitor")
    rule = one("PrometheusRule")
    policy = one("NetworkPolicy")
    secrets = {doc["metadata"]["name"]: doc for _, doc in by_kind.get("Secret", [])}

    # 2. The Prometheus Operator's resources.
    if rule and rule.get("spec") != prometheus_rule()["spec"]:
        errors.append(
            "monitoring/prometheusrule.yaml differs from deploy/prometheus-alerts.yml: run "
            f"{sys.executable} scripts/check-kubernetes-manifests.py --write-prometheusrule"
        )
    service_labels = service.get("metadata", {}).get("labels", {})
    port_names = [p.get("name") for p in service.get("spec", {}).get("ports", [])]
    if monitor:
        wanted = monitor["spec"]["selector"]["matchLabels"]
        if any(service_labels.get(k) != v for k, v in wanted.items()):
            errors.append(f"the ServiceMonitor's selector {wanted} does not select the Service {service_labels}")
        for endpoint in monitor["spec"]["endpoints"]:
            if endpoint.get("port") not in port_names:
                errors.append(f"the ServiceMonitor scrapes port {endpoint.get('port')!r}; the Service has {port_names}")
            if endpoint.get("path", "/metrics") != "/metrics":
                errors.append("the ServiceMonitor must scrape /metrics")

    # 3. The manifests against each other and the service.
    if deployment and configmap:
        pod = deployment["spec"]["template"]
        spec = pod["spec"]
        container = spec["containers"][0]
        env = {e["name"]: e for e in container.get("env", [])}
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        addr = env.get("HTTP_ADDR", {}).get("value", "")
        if not addr.startswith("0.0.0.0:") or ports.get("http") != int(addr.rsplit(":", 1)[1]):
            errors.append(f"HTTP_ADDR {addr!r} must listen on all interfaces on the port named http {ports}")
        for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
            get = container.get(probe, {}).get("httpGet", {})
            if get.get("path") != path or get.get("port") not in ("http", ports.get("http")):
                errors.append(f"{probe} must GET {path} on the http port, not {get}")
        if container.get("args") != ["serve"]:
            errors.append(f"the Deployment must run `serve`, not {container.get('args')}")
        data = configmap["data"]
        name = next(iter(data))
        config = tomllib.loads(data[name])
        shutdown = config.get("shutdown_timeout", "20s")
        match = re.fullmatch(r"(\d+)s", shutdown)
        if not match:
            errors.append(f"shutdown_timeout {shutdown!r}: write it in whole seconds here")
        elif spec.get("terminationGracePeriodSeconds", 30) < int(match.group(1)) + 10:
            errors.append(
                f"terminationGracePeriodSeconds {spec.get('terminationGracePeriodSeconds', 30)} "
                f"must exceed shutdown_timeout ({shutdown}) by 10 s or more"
            )
        mounts = {m["name"]: m for m in container.get("volumeMounts", [])}
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        config_path = env.get("ORDER_TIMEOUT_CONFIG", {}).get("value")
        config_mount = [m for m in mounts.values() if m["mountPath"] == config_path]
        if not config_mount or volumes[config_mount[0]["name"]].get("configMap", {}).get("name") != configmap["metadata"]["name"] or config_mount[0].get("subPath") != name:
            errors.append(f"ORDER_TIMEOUT_CONFIG {config_path!r} must be the ConfigMap's {name} mounted there")
        pod_labels = pod["metadata"]["labels"]
        for what, selector in (
            ("Deployment", deployment["spec"]["selector"]["matchLabels"]),
            ("Service", service["spec"]["selector"]),
            ("PodDisruptionBudget", pdb["spec"]["selector"]["matchLabels"]),
        ):
            if any(pod_labels.get(k) != v for k, v in selector.items()):
                errors.append(f"the {what}'s selector {selector} does not select the serving pods {pod_labels}")
        job_labels = job["spec"]["template"]["metadata"]["labels"]
        if all(job_labels.get(k) == v for k, v in service["spec"]["selector"].items()):
            errors.append("the Service selects the migrate Job's pods too")
        for port in service["spec"]["ports"]:
            if port.get("targetPort") not in ("http", ports.get("http")):
                errors.append(f"the Service's port {port.get('name')} targets {port.get('targetPort')}, not the http port")
        if policy:
            errors.extend(network_policy_errors(policy, pod_labels, ports))
        user = spec.get("securityContext", {}).get("runAsUser")
        dockerfile = (ROOT / "Dockerfile").read_text()
        if f"USER {user}:" not in dockerfile:
            errors.append(f"runAsUser {user} is not the Dockerfile's USER")

    for what, pod_spec in (("Deployment", deployment), ("Job", job)):
        if not pod_spec:
            continue
        spec = pod_spec["spec"]["template"]["spec"]
        for container in spec["containers"]:
            for e in container.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref and not ref.get("optional"):
                    secret = secrets.get(ref["name"], {})
                    if ref["key"] not in secret.get("stringData", {}) | secret.get("data", {}):
                        errors.append(f"{what} reads {ref['key']} of Secret {ref['name']}, which has no such key")
        for volume in spec.get("volumes", []):
            if "secret" in volume and volume["secret"]["secretName"] not in secrets:
                errors.append(f"{what} mounts Secret {volume['secret']['secretName']}, which is not here")
    if job:
        container = job["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e for e in container.get("env", [])}
        if container.get("args") != ["migrate"]:
            errors.append(f"the Job must run `migrate`, not {container.get('args')}")
        key = env.get("DATABASE_URL", {}).get("valueFrom", {}).get("secretKeyRef", {}).get("key")
        if key != "MIGRATE_DATABASE_URL":
            errors.append("the migrate Job must connect as the migrating user (MIGRATE_DATABASE_URL)")

    for path, doc in resources:
        if doc.get("kind") == "Kustomization":
            listed = set(doc.get("resources", []))
            here = {p.name for p in path.parent.glob("*.yaml") if p.name != "kustomization.yaml"}
            for missing in sorted(here - listed):
                errors.append(f"{path.relative_to(args.manifests)} does not list {missing}")
            for absent in sorted(listed - here):
                errors.append(f"{path.relative_to(args.manifests)} lists {absent}, which does not exist")

    if errors:
        print("\n".join(f"ERROR {e}" for e in errors))
        return 1
    print(
        f"ok: {len(resources)} resources; {validated} validations against Kubernetes "
        f"{', '.join(versions)} (kubernetes-validate {kv_version()}, strict); "
        "PrometheusRule = deploy/prometheus-alerts.yml; manifests consistent"
    )
    return 0


def network_policy_errors(policy, pod_labels, ports):
    """The NetworkPolicy selects the serving pods, restricts their ingress, and admits
    only their http port, each rule from named sources (an empty `from` admits anyone)."""
    errors = []
    spec = policy.get("spec", {})
    selector = spec.get("podSelector", {}).get("matchLabels", {})
    if not selector or any(pod_labels.get(k) != v for k, v in selector.items()):
        errors.append(f"the NetworkPolicy's podSelector {selector} does not select the serving pods {pod_labels}")
    if "Ingress" not in spec.get("policyTypes", []):
        errors.append("the NetworkPolicy must restrict Ingress")
    for rule in spec.get("ingress", []):
        if not rule.get("from"):
            errors.append("a NetworkPolicy ingress rule without `from` admits everyone")
        for port in rule.get("ports", []) or [{}]:
            if port.get("port") not in ("http", ports.get("http")):
                errors.append(f"the NetworkPolicy admits port {port.get('port')!r}, not only the http port")
    return errors


def kv_version():
    from kubernetes_validate.version import __version__

    return __version__


if __name__ == "__main__":
    sys.exit(main())
