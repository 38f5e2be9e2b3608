"""What a Kubernetes API server (and its controllers) would refuse or
ignore in a rendered overlay of deploy/k8s, which `kubectl kustomize`
and podman's `kube play` let through: the checks of
docs/kubernetes.md, "What was run here and what was not".

  * port names: IANA service names (at most 15 characters, lowercase
    letters, digits and single hyphens, a letter among them), unique in
    a pod; a probe's port by name is one of its own container's;
  * probes only on ordinary containers and native sidecars (an init
    container with restartPolicy Always);
  * $(VAR) in command and args: a variable the container declares;
    every volume mounted is declared;
  * a workload's selector matches its pod template's labels; a
    StatefulSet's serviceName is a headless Service selecting its pods;
  * a Service selects some pod template, and a targetPort by name is a
    port of an ordinary container of each: the named ports of native
    sidecars reach no EndpointSlice before Kubernetes 1.32 (kubernetes
    #127958, #128850);
  * a PodMonitor selects some pod template, on ports it has;
  * every pod meets the "restricted" Pod Security Standard (non-root,
    seccomp RuntimeDefault or Localhost, no privilege escalation, every
    capability dropped, no host namespaces or host paths), with a
    read-only root file system;
  * the engine and its agent share one memory-backed /dev/shm that
    holds the engine's KV pool, within the engine's memory limit.

usage: k8s_check.py RENDERED.yaml   (exit 1 with each finding on stderr)
"""
import re
import sys

import yaml

PORT_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
VAR_REF = re.compile(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
# the restricted standard's volume types
VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
           "persistentVolumeClaim", "projected", "secret"}
# KV bytes per block of each model pdx-engine knows (common/models.c:
# layers x tensors x kv_heads x head_dim x dtype bytes x block tokens),
# and its default pool (PDX_ENGINE_DEFAULT_KV_TOKENS, 16384 tokens)
MODELS = {"llama3-8b": (32 * 2 * 8 * 128 * 2 * 16, 16),
          "qwen2-7b": (28 * 2 * 4 * 128 * 2 * 16, 16),
          "llama3-70b": (80 * 2 * 8 * 128 * 2 * 16, 16),
          "deepseek-v3": (61 * 1 * 1 * 576 * 2 * 64, 64)}
DEFAULT_TOKENS = 16384
UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
         "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}

problems = []


def bad(where, what):
    problems.append("%s: %s" % (where, what))


def quantity(q):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]i?|k)?", str(q))
    if not m:
        return None
    return int(float(m.group(1)) * UNITS.get(m.group(2) or "", 1))


def matches(selector, labels):
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        have = e["key"] in labels
        op, vals = e["operator"], e.get("values") or []
        if (op == "In" and labels.get(e["key"]) not in vals) or \
           (op == "NotIn" and have and labels[e["key"]] in vals) or \
           (op == "Exists" and not have) or (op == "DoesNotExist" and have):
            return False
    return True


def sidecar(c):
    return c.get("restartPolicy") == "Always"


def arg(c, name):
    """The value of --name=V or --name V in a container's args."""
    a = (c.get("command") or []) + (c.get("args") or [])
    for i, w in enumerate(a):
        if w.startswith("--%s=" % name):
            return w.split("=", 1)[1]
        if w == "--" + name and i + 1 < len(a):
            return a[i + 1]
    return None


def check_pod(where, spec, labels):
    inits = spec.get("initContainers") or []
    ctrs = spec.get("containers") or []
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    pod_sc = spec.get("securityContext") or {}
    seen_ports = {}
    for h in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(h):
            bad(where, "%s: outside the restricted Pod Security Standard" % h)
    for n, v in volumes.items():
        kind = [k for k in v if k != "name"]
        if not set(kind) <= VOLUMES:
            bad(where, "volume %s (%s): outside the restricted Pod Security "
                "Standard" % (n, ", ".join(kind)))
    if not pod_sc.get("runAsNonRoot"):
        bad(where, "securityContext.runAsNonRoot is not true")
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    for c in inits + ctrs:
        cw = "%s container %s" % (where, c["name"])
        sc = c.get("securityContext") or {}
        seccomp = (sc.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad(cw, "no seccompProfile RuntimeDefault or Localhost (pod or "
                "container): the restricted Pod Security Standard refuses it")
        if sc.get("allowPrivilegeEscalation") is not False:
            bad(cw, "allowPrivilegeEscalation is not false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            bad(cw, "capabilities.drop lacks ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            bad(cw, "capabilities added: %s" % caps["add"])
        if sc.get("readOnlyRootFilesystem") is not True:
            bad(cw, "readOnlyRootFilesystem is not true (docs/kubernetes.md)")
        names = set()
        for p in c.get("ports") or []:
            n = p.get("name")
            if n is None:
                continue
            if len(n) > 15 or not PORT_NAME.match(n) or "--" in n or \
               not re.search("[a-z]", n):
                bad(cw, "port name %r: not an IANA service name (15 "
                    "characters at most, lowercase, digits, single hyphens)" % n)
            if n in seen_ports:
                bad(cw, "port name %r also in container %s" % (n, seen_ports[n]))
            seen_ports[n] = c["name"]
            names.add(n)
        is_init = c in inits
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = c.get(kind)
            if not probe:
                continue
            if is_init and not sidecar(c):
                bad(cw, "%s on an init container that is no sidecar" % kind)
            for how in ("httpGet", "tcpSocket", "grpc"):
                port = (probe.get(how) or {}).get("port")
                if isinstance(port, str) and port not in names:
                    bad(cw, "%s port %r: not a port name of this container"
                        % (kind, port))
        env = {e["name"] for e in c.get("env") or []}
        for w in (c.get("command") or []) + (c.get("args") or []):
            for v in VAR_REF.findall(w):
                if v not in env:
                    bad(cw, "$(%s) in %r: no such variable (left as it is)"
                        % (v, w))
        for m in c.get("volumeMounts") or []:
            if m["name"] not in volumes:
                bad(cw, "mounts volume %s, which the pod lacks" % m["name"])
    # the engine's KV pool in a /dev/shm it shares with its agent
    for c in ctrs:
        model = arg(c, "model")
        if (c.get("command") or [""])[0] != "pdx-engine" or model not in MODELS:
            continue
        cw = "%s container %s" % (where, c["name"])
        block, tokens = MODELS[model]
        blocks = arg(c, "kv-blocks")
        pool = block * (int(blocks) if blocks else DEFAULT_TOKENS // tokens)
        shm = [m["name"] for m in c.get("volumeMounts") or []
               if m["mountPath"] == "/dev/shm"]
        if not shm:
            bad(cw, "%s's pool (%d MiB) in the runtime's /dev/shm (64 MiB): "
                "mount an emptyDir of medium Memory there" % (model, pool >> 20))
            continue
        vol = volumes.get(shm[0], {}).get("emptyDir") or {}
        size = quantity(vol.get("sizeLimit", 0))
        if vol.get("medium") != "Memory" or not size or size < pool:
            bad(cw, "/dev/shm (volume %s) does not hold %s's pool of %d MiB"
                % (shm[0], model, pool >> 20))
        limit = quantity(((c.get("resources") or {}).get("limits") or {})
                         .get("memory", 0))
        if limit and limit < pool:
            bad(cw, "memory limit below its pool's %d MiB (the pool's pages "
                "count against it)" % (pool >> 20))
        agent = arg(c, "agent")
        for a in inits + ctrs:
            if a is c or arg(a, "engine") != agent:
                continue
            if shm[0] not in [m["name"] for m in a.get("volumeMounts") or []
                              if m["mountPath"] == "/dev/shm"]:
                bad(cw, "its agent %s does not mount the same /dev/shm"
                    % a["name"])


def main(path):
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    pods = []  # (where, labels, spec)
    for d in docs:
        kind, name = d["kind"], d["metadata"]["name"]
        where = "%s/%s" % (kind, name)
        if kind in ("Deployment", "StatefulSet", "DaemonSet"):
            tmpl = d["spec"]["template"]
            labels = tmpl["metadata"].get("labels") or {}
            if not matches(d["spec"]["selector"], labels):
                bad(where, "selector does not match its template's labels")
            check_pod(where, tmpl["spec"], labels)
            pods.append((where, labels, tmpl["spec"], d))
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for name, s in services.items():
        where = "Service/" + name
        sel = s["spec"].get("selector") or {}
        chosen = [p for p in pods if matches({"matchLabels": sel}, p[1])]
        if not chosen:
            bad(where, "selects no pod template")
        for port in s["spec"].get("ports") or []:
            tp = port.get("targetPort")
            if not isinstance(tp, str):
                continue
            for pw, _, spec, _ in chosen:
                ordinary = {p.get("name") for c in spec.get("containers") or []
                            for p in c.get("ports") or []}
                sidecars = {p.get("name") for c in spec.get("initContainers") or []
                            for p in c.get("ports") or []}
                if tp in ordinary:
                    continue
                bad(where, "targetPort %r: %s" % (tp, (
                    "a port of a native sidecar of %s: Kubernetes before 1.32 "
                    "leaves it out of the EndpointSlices (kubernetes #127958); "
                    "give its number" if tp in sidecars else
                    "no port of that name in %s") % pw))
    for pw, labels, _, d in pods:
        if d["kind"] != "StatefulSet":
            continue
        s = services.get(d["spec"].get("serviceName"))
        if not s or s["spec"].get("clusterIP") != "None" or \
           not matches({"matchLabels": s["spec"].get("selector") or {}}, labels):
            bad(pw, "serviceName %r: no headless Service selecting its pods"
                % d["spec"].get("serviceName"))
    for d in docs:
        if d["kind"] != "PodMonitor":
            continue
        where = "PodMonitor/" + d["metadata"]["name"]
        chosen = [p for p in pods if matches(d["spec"]["selector"], p[1])]
        if not chosen:
            bad(where, "selects no pod template")
        for ep in d["spec"].get("podMetricsEndpoints") or []:
            have = [p for p in chosen if ep.get("port") in
                    {q.get("name") for c in (p[2].get("containers") or []) +
                     (p[2].get("initContainers") or [])
                     for q in c.get("ports") or []}]
            if chosen and not have:
                bad(where, "port %r: in none of the pods it selects"
                    % ep.get("port"))
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
