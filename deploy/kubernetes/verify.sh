#!/usr/bin/env bash
# verify.sh [BUILD_DIR]: checks deploy/kubernetes/psd.yaml without a Kubernetes cluster: every
# document parses; the manifest in its ConfigMap passes `psctl check`; the StatefulSet has one
# pod per server and each server's host is its pod's name under the headless Service; the ports
# and the probes are the manifest's; the pod's command gives pod psd-N `--shard N`; the Job runs
# pslaunch --follow. Exit 77 (skipped) without python3's yaml module.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
python3 -c 'import yaml' 2>/dev/null || { echo "verify.sh: no python3 yaml module: skipped"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/psd-k8s.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

python3 - "$root/deploy/kubernetes/psd.yaml" "$tmp" <<'PY' || exit 1
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
out = sys.argv[2]
kinds = {d["kind"]: d for d in docs}
def fail(msg):
    print("verify.sh: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)
if "Secret" in kinds:
    fail("psd.yaml holds a Secret: a well-known cluster secret would be applied with it")
for k in ("ConfigMap", "Service", "StatefulSet", "Job"):
    if k not in kinds:
        fail("no " + k)
text = kinds["ConfigMap"]["data"]["cluster.yaml"]
open(out + "/cluster.yaml", "w").write(text)
m = yaml.safe_load(text)
svc, sts, job = kinds["Service"], kinds["StatefulSet"], kinds["Job"]
if svc["spec"].get("clusterIP") != "None" or not svc["spec"].get("publishNotReadyAddresses"):
    fail("the Service must be headless and publish not-ready addresses")
if sts["spec"]["serviceName"] != svc["metadata"]["name"]:
    fail("the StatefulSet's serviceName is not the Service")
servers = m["servers"]
if sts["spec"]["replicas"] != len(servers):
    fail("replicas %d, servers %d" % (sts["spec"]["replicas"], len(servers)))
name, sname = sts["metadata"]["name"], svc["metadata"]["name"]
pod = sts["spec"]["template"]["spec"]
c = pod["containers"][0]
ports = {p["containerPort"] for p in c["ports"]}
for i, s in enumerate(servers):
    if s["host"] != "%s-%d.%s" % (name, i, sname):
        fail("servers[%d].host %s is not pod %s-%d under Service %s" % (i, s["host"], name, i, sname))
    if s["port"] not in ports or s.get("metrics_port") not in ports:
        fail("servers[%d]'s ports are not the container's" % i)
    if s.get("metrics_host") != "0.0.0.0":
        fail("servers[%d].metrics_host must be 0.0.0.0 for the kubelet's probes" % i)
g = c["readinessProbe"]["httpGet"]
if g["path"] != "/healthz" or g["port"] != servers[0]["metrics_port"]:
    fail("the readiness probe is not /healthz on the metrics port")
if c["livenessProbe"].get("tcpSocket", {}).get("port") != servers[0]["metrics_port"]:
    fail("the liveness probe is not a TCP connect to the metrics port")
st = c.get("startupProbe", {})
if st.get("tcpSocket", {}).get("port") != servers[0]["metrics_port"]:
    fail("the startup probe is not a TCP connect to the metrics port")
if st.get("periodSeconds", 10) * st.get("failureThreshold", 3) < 600:
    fail("the startup probe gives psd less than 10 minutes to load its store")
vols = {v["name"]: v for v in pod["volumes"]}
if vols.get("secret", {}).get("secret", {}).get("secretName") != "psd-secret":
    fail("the secret volume is not Secret psd-secret")
mounts = {v["mountPath"] for v in c["volumeMounts"]}
secret_dir = m["secret_file"].rsplit("/", 1)[0]
if "/etc/psd" not in mounts or secret_dir not in mounts:
    fail("the manifest or the secret is not mounted where the manifest says")
for s in servers:
    if not any(s["data_dir"].startswith(p + "/") for p in mounts):
        fail("data_dir %s is on no volume" % s["data_dir"])
open(out + "/psd-command", "w").write(c["command"][2])
w = job["spec"]["template"]["spec"]["containers"][0]["command"]
if w[0] != "pslaunch" or "--follow" not in w or w[w.index("--manifest") + 1] != "/etc/psd/cluster.yaml":
    fail("the Job does not run pslaunch --manifest /etc/psd/cluster.yaml --follow")
PY

# The manifest as psd reads it (its secret_file need not exist for a check).
"$build/server/psctl" --manifest "$tmp/cluster.yaml" check > "$tmp/check" ||
    { echo "verify.sh: FAIL: psctl check refused the ConfigMap's manifest" >&2; exit 1; }
# Pod psd-1 runs shard 1: the command with a stand-in psd that prints its arguments.
mkdir "$tmp/bin"
printf '#!/bin/sh\necho "$@"\n' > "$tmp/bin/psd"
chmod +x "$tmp/bin/psd"
got=$(HOSTNAME=psd-1 PATH="$tmp/bin:$PATH" /bin/sh -c "$(cat "$tmp/psd-command")")
[ "$got" = "--manifest /etc/psd/cluster.yaml --shard 1" ] ||
    { echo "verify.sh: FAIL: pod psd-1 would run: psd $got" >&2; exit 1; }
echo "verify.sh: deploy/kubernetes/psd.yaml is consistent with its manifest"
