#!/usr/bin/env python3
"""An empty Kubernetes 1.30 API server with the prometheus-operator CRDs installed, for
deploy/helm/test.sh: Helm 3's `helm install --dry-run=client` renders NOTES.txt only after
talking to a cluster (Helm 4's needs none).

    empty-apiserver.py KUBECONFIG

listens on a free port of 127.0.0.1 (plain HTTP, no authentication), writes a kubeconfig
that points at it to KUBECONFIG once it accepts connections, and serves until killed.

What Helm 3.17's client-side dry run asks, and what this answers, as kube-apiserver does:
- GET /version (the cluster-reachable check, and the version Chart.yaml's kubeVersion is
  checked against): a version.Info (k8s.io/apimachinery/pkg/version/types.go) of v1.30.0,
  the chart's oldest supported Kubernetes; of its build fields only the platform.
- GET /api, /apis, /api/v1, /apis/GROUP/VERSION (discovery: the REST mapping of every kind
  in the render; a kind missing here fails the dry run with "no matches for kind", as on a
  cluster without it): the unaggregated documents APIVersions, APIGroupList and
  APIResourceList (k8s.io/apimachinery/pkg/apis/meta/v1/types.go; served by
  k8s.io/apiserver/pkg/endpoints/discovery). client-go asks for aggregated discovery first
  and falls back to these when the answer's Content-Type is plain application/json
  (k8s.io/client-go/discovery/discovery_client.go). The resources are those of
  `kubectl api-resources` on a 1.30 cluster, preferred versions, subresources left out.
- GET of one object (Helm checks that no object of the release exists yet): 404 with a
  NotFound Status naming the resource and object, as the registry's Get answers for a
  missing key (k8s.io/apimachinery/pkg/api/errors.NewNotFound): the cluster is empty.
- Anything else GET asks for (/openapi/v2, /openapi/v3 among them: Helm is run with
  --disable-openapi-validation, kubernetes-validate checks the schemas): 404 with the
  NotFound Status kube-apiserver's not-found handler writes
  (k8s.io/apiserver/pkg/endpoints/handlers/responsewriters, errors.NewGenericServerResponse).

Unlike a real server it refuses every write (403, a Forbidden Status): a dry run that
writes is a bug this should surface, not hide.
"""

import http.server
import json
import os
import sys

# (resource, kind, namespaced) by group/version ("v1" is the core group, served under /api).
RESOURCES = {
    "v1": [
        ("configmaps", "ConfigMap", True),
        ("endpoints", "Endpoints", True),
        ("events", "Event", True),
        ("limitranges", "LimitRange", True),
        ("namespaces", "Namespace", False),
        ("nodes", "Node", False),
        ("persistentvolumeclaims", "PersistentVolumeClaim", True),
        ("persistentvolumes", "PersistentVolume", False),
        ("pods", "Pod", True),
        ("podtemplates", "PodTemplate", True),
        ("replicationcontrollers", "ReplicationController", True),
        ("resourcequotas", "ResourceQuota", True),
        ("secrets", "Secret", True),
        ("serviceaccounts", "ServiceAccount", True),
        ("services", "Service", True),
    ],
    "admissionregistration.k8s.io/v1": [
        ("mutatingwebhookconfigurations", "MutatingWebhookConfiguration", False),
        ("validatingadmissionpolicies", "ValidatingAdmissionPolicy", False),
        ("validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding", False),
        ("validatingwebhookconfigurations", "ValidatingWebhookConfiguration", False),
    ],
    "apiextensions.k8s.io/v1": [
        ("customresourcedefinitions", "CustomResourceDefinition", False),
    ],
    "apps/v1": [
        ("controllerrevisions", "ControllerRevision", True),
        ("daemonsets", "DaemonSet", True),
        ("deployments", "Deployment", True),
        ("replicasets", "ReplicaSet", True),
        ("statefulsets", "StatefulSet", True),
    ],
    "autoscaling/v2": [
        ("horizontalpodautoscalers", "HorizontalPodAutoscaler", True),
    ],
    "batch/v1": [
        ("cronjobs", "CronJob", True),
        ("jobs", "Job", True),
    ],
    "certificates.k8s.io/v1": [
        ("certificatesigningrequests", "CertificateSigningRequest", False),
    ],
    "coordination.k8s.io/v1": [
        ("leases", "Lease", True),
    ],
    "discovery.k8s.io/v1": [
        ("endpointslices", "EndpointSlice", True),
    ],
    "events.k8s.io/v1": [
        ("events", "Event", True),
    ],
    "flowcontrol.apiserver.k8s.io/v1": [
        ("flowschemas", "FlowSchema", False),
        ("prioritylevelconfigurations", "PriorityLevelConfiguration", False),
    ],
    "networking.k8s.io/v1": [
        ("ingressclasses", "IngressClass", False),
        ("ingresses", "Ingress", True),
        ("networkpolicies", "NetworkPolicy", True),
    ],
    "node.k8s.io/v1": [
        ("runtimeclasses", "RuntimeClass", False),
    ],
    "policy/v1": [
        ("poddisruptionbudgets", "PodDisruptionBudget", True),
    ],
    "rbac.authorization.k8s.io/v1": [
        ("clusterrolebindings", "ClusterRoleBinding", False),
        ("clusterroles", "ClusterRole", False),
        ("rolebindings", "RoleBinding", True),
        ("roles", "Role", True),
    ],
    "scheduling.k8s.io/v1": [
        ("priorityclasses", "PriorityClass", False),
    ],
    "storage.k8s.io/v1": [
        ("csidrivers", "CSIDriver", False),
        ("csinodes", "CSINode", False),
        ("csistoragecapacities", "CSIStorageCapacity", True),
        ("storageclasses", "StorageClass", False),
        ("volumeattachments", "VolumeAttachment", False),
    ],
    # The prometheus-operator CRDs the chart's monitoring objects need.
    "monitoring.coreos.com/v1": [
        ("alertmanagers", "Alertmanager", True),
        ("podmonitors", "PodMonitor", True),
        ("probes", "Probe", True),
        ("prometheuses", "Prometheus", True),
        ("prometheusrules", "PrometheusRule", True),
        ("servicemonitors", "ServiceMonitor", True),
        ("thanosrulers", "ThanosRuler", True),
    ],
}
VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


def base_path(group_version):
    """The URL path a group/version is served under: /api/v1 for the core group."""
    return "/api/v1" if group_version == "v1" else "/apis/" + group_version


def status(code, reason, message, details):
    """A metav1.Status of a failed request, as kube-apiserver writes it."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": details,
        "code": code,
    }


def not_found_object(group_version, path):
    """The NotFound Status of an object GET (`<base>/[namespaces/<ns>/]<resource>/<name>`)
    of a resource that exists, else None (the path names no object of this API)."""
    base = base_path(group_version)
    if not path.startswith(base + "/"):
        return None
    parts = path[len(base) + 1:].split("/")
    namespaced = len(parts) == 4 and parts[0] == "namespaces"
    if namespaced:
        parts = parts[2:]
    if len(parts) != 2 or not all(parts):
        return None
    resource, name = parts
    for res, _kind, res_namespaced in RESOURCES[group_version]:
        if res == resource and res_namespaced == namespaced:
            group = group_version.rpartition("/")[0]
            qualified = f"{resource}.{group}" if group else resource
            details = {"name": name, "kind": resource}
            if group:
                details["group"] = group
            return status(404, "NotFound", f'{qualified} "{name}" not found', details)
    return None


def answer(path):
    """(HTTP status, JSON body) of a GET of `path` (query string removed)."""
    if path == "/version":
        return 200, {
            "major": "1",
            "minor": "30",
            "gitVersion": "v1.30.0",
            "platform": "linux/amd64",
        }
    if path == "/api":
        return 200, {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:443"}
            ],
        }
    if path == "/apis":
        groups = []
        for group_version in RESOURCES:
            if group_version == "v1":
                continue
            group, _, version = group_version.partition("/")
            preferred = {"groupVersion": group_version, "version": version}
            groups.append({"name": group, "versions": [preferred], "preferredVersion": preferred})
        return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
    for group_version, resources in RESOURCES.items():
        if path == base_path(group_version):
            return 200, {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": group_version,
                "resources": [
                    {
                        "name": resource,
                        "singularName": kind.lower(),
                        "namespaced": namespaced,
                        "kind": kind,
                        "verbs": VERBS,
                    }
                    for resource, kind, namespaced in resources
                ],
            }
        missing = not_found_object(group_version, path)
        if missing:
            return 404, missing
    return 404, status(404, "NotFound", "the server could not find the requested resource", {})


class Handler(http.server.BaseHTTPRequestHandler):
    """Serves `answer` to GETs and refuses everything else."""

    def reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        sys.stderr.write(f"GET {self.path}\n")
        self.reply(*answer(self.path.partition("?")[0]))

    def refuse(self):
        sys.stderr.write(f"{self.command} {self.path}: refused\n")
        self.reply(403, status(403, "Forbidden",
                               f"{self.command} {self.path}: this test server serves reads only; "
                               "a client-side dry run must not write", {}))

    do_POST = do_PUT = do_PATCH = do_DELETE = refuse

    def log_message(self, format, *args):
        """do_GET and refuse log each request; the default access log would repeat it."""


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: empty-apiserver.py KUBECONFIG (the kubeconfig to write)")
    kubeconfig = sys.argv[1]
    # Bound and listening once constructed: connections made from here on are served.
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = server.server_address[1]
    # JSON is YAML: client-go's kubeconfig loader reads it.
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "empty", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "anonymous", "user": {}}],
        "contexts": [{"name": "empty", "context": {"cluster": "empty", "user": "anonymous"}}],
        "current-context": "empty",
    }
    partial = kubeconfig + ".partial"
    with open(partial, "w") as f:
        json.dump(config, f)
    os.replace(partial, kubeconfig)
    server.serve_forever()


if __name__ == "__main__":
    main()
