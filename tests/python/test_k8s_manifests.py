"""The Kubernetes manifests in deploy/kubernetes/ are valid and run as written, with no cluster.

* Schema: every document of every manifest validates against the Kubernetes 1.30 JSON schemas
  bundled by the `kubernetes-validate` package, in strict mode (unknown fields are errors), and
  a misspelled field in a copy is caught (so the check cannot pass vacuously).
* Command lines: every `llmreplay` container's args are expanded as the kubelet expands them
  (`$(VAR)` from the container's env, ConfigMap keys and the Indexed Job's
  JOB_COMPLETION_INDEX; none may stay unresolved), every flag must appear in
  `llmreplay <sub> --help`, and clap must accept the whole line (`--help` appended: unknown
  flags and bad values are still errors).
* The sharded replay: the Job is Indexed with parallelism == completions == LLMREPLAY_SHARDS,
  uses --shard-from-env and one --start-at, and writes per-index files. Then it runs: the
  START_AT placeholder is filled as the guide's sed/envsubst does, each volume is a temporary
  directory, the target a local `llmreplay sim`, and all N shards start together; the merge
  Job's command then merges exactly what they wrote, every request counted once.
* The capture sidecar: ports, probes and drain timing are consistent (Service -> --listen,
  readiness probe -> --admin /readyz, --upstream -> the serving container's port, preStop +
  --drain-timeout within the grace period), and the container's command line starts, becomes
  ready, records a request sent through it, and exits 0 on SIGTERM with a Parquet file.

`kubernetes-validate` (and PyYAML, its dependency) come from tests/python/requirements.txt;
without them this module skips loudly, and under CI=true it fails.
"""

import copy
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from conftest import ROOT, free_port, llmreplay_binary

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
if IN_CI:
    import kubernetes_validate  # tests/python/requirements.txt: a missing package fails CI
    import yaml
else:
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate",
        reason="kubernetes-validate not installed: pip install -r tests/python/requirements.txt",
    )
    yaml = pytest.importorskip("yaml")

K8S_DIR = ROOT / "deploy" / "kubernetes"
# The oldest Kubernetes the manifests are written for (native fields only; no betas needed).
K8S_VERSION = "1.30"
START_AT_PLACEHOLDER = "${START_AT}"
LOCAL_HOSTS = ("0.0.0.0", "127.0.0.1", "localhost")


# ---------------------------------------------------------------------------------------------
# Loading


def manifest_files():
    return sorted(p for p in K8S_DIR.rglob("*") if p.suffix in (".yaml", ".yml"))


def load_docs(path, text=None):
    text = path.read_text(encoding="utf-8") if text is None else text
    return [d for d in yaml.safe_load_all(text) if d is not None]


def all_docs():
    """(file, index, document) of every manifest document."""
    return [(p, i, d) for p in manifest_files() for i, d in enumerate(load_docs(p))]


def find(docs, kind, pred=lambda d: True):
    found = [d for d in docs if d.get("kind") == kind and pred(d)]
    assert found, f"no {kind} in {K8S_DIR}"
    return found


def pod_spec(doc):
    if doc["kind"] == "Pod":
        return doc["spec"]
    return doc["spec"]["template"]["spec"]


def is_indexed_job(doc):
    return doc.get("kind") == "Job" and doc["spec"].get("completionMode") == "Indexed"


def llmreplay_containers(spec):
    return [c for c in spec.get("containers", []) if c.get("command") == ["llmreplay"]]


def doc_id(param):
    path, i, doc = param
    name = doc.get("metadata", {}).get("name")
    return f"{path.relative_to(K8S_DIR)}#{i}:{doc.get('kind')}/{name}"


@pytest.fixture(scope="module")
def docs():
    d = [doc for _, _, doc in all_docs()]
    assert d, f"no manifests under {K8S_DIR}"
    return d


@pytest.fixture(scope="module")
def binary():
    b = llmreplay_binary()
    if not b.exists():
        why = f"{b} not built (cargo build --release --bin llmreplay, or set LLMREPLAY)"
        if IN_CI:
            pytest.fail(f"CI: {why}")
        pytest.skip(why)
    return b


# ---------------------------------------------------------------------------------------------
# Schema validation


def validation_error(doc):
    """None if doc is valid, else where and why (short: no schema dump in the report)."""
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        where = "/".join(str(p) for p in e.absolute_path)
        return f"{doc['kind']} at {where or '<root>'}: {e.message}"
    return None


def test_validator_bundles_the_kubernetes_version():
    versions = kubernetes_validate.utils.all_versions()
    assert any(v.startswith(K8S_VERSION + ".") for v in versions), (
        f"kubernetes-validate {kubernetes_validate.version.__version__} has no "
        f"{K8S_VERSION} schemas (it has {versions[0]}..{versions[-1]})"
    )


@pytest.mark.parametrize("entry", all_docs() if K8S_DIR.exists() else [], ids=doc_id)
def test_manifest_validates_strictly(entry):
    path, _, doc = entry
    error = validation_error(doc)
    if error:
        pytest.fail(f"{path.name}: {error}", pytrace=False)


def _misspell(doc, path, wrong):
    """A copy of doc with the key at path (a list of keys/indices) renamed to wrong."""
    d = copy.deepcopy(doc)
    parent = d
    for k in path[:-1]:
        parent = parent[k]
    parent[wrong] = parent.pop(path[-1])
    return d


@pytest.mark.parametrize(
    "path,wrong",
    [
        (["spec", "completionMode"], "completionMod"),
        (["spec", "template", "spec", "containers", 0, "args"], "arg"),
        (["spec", "template", "spec", "containers", 0, "volumeMounts", 0, "mountPath"], "mountpth"),
    ],
)
def test_a_misspelled_field_is_caught(docs, path, wrong):
    job = find(docs, "Job", is_indexed_job)[0]
    assert validation_error(job) is None
    assert validation_error(_misspell(job, path, wrong)) is not None, f"{wrong} not caught"


def test_a_wrong_type_is_caught(docs):
    job = copy.deepcopy(find(docs, "Job", is_indexed_job)[0])
    job["spec"]["completions"] = "4"
    assert "'4' is not of type 'integer'" in (validation_error(job) or "")


# ---------------------------------------------------------------------------------------------
# The kubelet's view of a container: env, $(VAR) expansion, volume paths

_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(s, env):
    """Kubernetes' $(VAR) expansion: $$ -> $, a defined $(VAR) -> its value, else unchanged."""

    def sub(m):
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return _REF.sub(sub, s)


def container_env(container, docs, extra=None):
    """The container's environment as the kubelet builds it (secrets: a placeholder)."""
    env = {}
    configmaps = {
        d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"
    }
    for e in container.get("env", []):
        name = e["name"]
        if "value" in e:
            env[name] = expand(e["value"], env)
            continue
        src = e["valueFrom"]
        if "configMapKeyRef" in src:
            ref = src["configMapKeyRef"]
            data = configmaps.get(ref["name"], {})
            if ref["key"] not in data:
                assert ref.get("optional"), (
                    f"env {name}: ConfigMap {ref['name']} has no key {ref['key']}"
                )
                continue
            env[name] = data[ref["key"]]
        elif "secretKeyRef" in src:
            if not src["secretKeyRef"].get("optional"):
                env[name] = "secret-" + name.lower()
        elif "fieldRef" in src:
            env[name] = "field-" + src["fieldRef"]["fieldPath"]
    env.update(extra or {})
    return env


def resolved_args(container, env):
    args = [expand(a, env) for a in container["args"]]
    left = [a for a in args if _REF.search(a)]
    assert not left, f"unresolved $(VAR) in {container['name']}'s args: {left}"
    return args


def volume_key(volume):
    """What identifies a volume's storage across pods (a PVC is shared, the rest per pod)."""
    if "persistentVolumeClaim" in volume:
        return "pvc-" + volume["persistentVolumeClaim"]["claimName"]
    return "vol-" + volume["name"]


def mounts(container, spec, claim_templates=()):
    """(mount path, volume, read-only) of each mount; a StatefulSet's claim templates are
    volumes of their own pod (give them as `claim_templates`)."""
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for t in claim_templates:
        volumes.setdefault(t["metadata"]["name"], {"name": t["metadata"]["name"]})
    out = []
    for m in container.get("volumeMounts", []):
        assert m["name"] in volumes, f"{container['name']} mounts undeclared volume {m['name']}"
        out.append((m["mountPath"].rstrip("/"), volumes[m["name"]], m.get("readOnly", False)))
    return out


def map_paths(args, container, spec, roots, tmp, claim_templates=()):
    """Args with every absolute path under a mount moved to the volume's temporary directory.

    Returns (args, inputs): inputs are the mapped paths on read-only mounts (files to provide).
    An absolute path that is under no mount fails: it would not survive the pod.
    """
    ms = sorted(mounts(container, spec, claim_templates), key=lambda m: -len(m[0]))
    out, inputs = [], []
    for a in args:
        if not a.startswith("/"):
            out.append(a)
            continue
        for mount_path, vol, ro in ms:
            if a == mount_path or a.startswith(mount_path + "/"):
                root = roots.setdefault(volume_key(vol), tmp / volume_key(vol))
                root.mkdir(parents=True, exist_ok=True)
                mapped = str(root) + a[len(mount_path):]
                out.append(mapped)
                if ro:
                    inputs.append(Path(mapped))
                break
        else:
            pytest.fail(f"{container['name']}: {a} is on no volume (lost with the pod)")
    return out, inputs


def flags(args):
    out = []
    for a in args:
        if a == "--":
            break
        if a.startswith("--"):
            out.append(a.split("=", 1)[0])
        elif re.fullmatch(r"-[A-Za-z]", a):
            out.append(a)
    return out


def option_value(args, flag):
    vals = [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]
    vals += [a.split("=", 1)[1] for a in args if a.startswith(flag + "=")]
    return vals


def run(cmd, timeout=60, **kw):
    return subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw
    )


def wait_http(url, timeout=20.0, proc=None):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"process exited {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status
        except (urllib.error.URLError, ConnectionError, OSError) as e:
            last = e
        time.sleep(0.1)
    pytest.fail(f"{url} did not answer within {timeout} s: {last}")


def post_json(url, body):
    """POSTs `body` as JSON; asserts 200 and returns the response's bytes."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200
        return r.read()


def start_at_in(seconds):
    t = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(seconds=seconds)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def every_llmreplay_container(docs):
    out = []
    for d in docs:
        if d["kind"] in ("Pod", "Job", "Deployment", "StatefulSet", "DaemonSet"):
            for c in llmreplay_containers(pod_spec(d)):
                out.append((d, c))
    return out


def test_there_are_llmreplay_commands_to_check(docs):
    subs = sorted(c["args"][0] for _, c in every_llmreplay_container(docs))
    assert subs == ["capture", "capture", "link", "merge", "replay"], subs


# ---------------------------------------------------------------------------------------------
# Every llmreplay command line, against the binary


def test_every_flag_is_one_the_binary_has(docs, binary):
    helps = {}
    for doc, c in every_llmreplay_container(docs):
        sub = c["args"][0]
        if sub not in helps:
            r = run([binary, sub, "--help"])
            assert r.returncode == 0, r.stderr
            helps[sub] = r.stdout
        for f in flags(c["args"][1:]):
            assert re.search(rf"(^|[\s,]){re.escape(f)}([\s=,]|$)", helps[sub], re.M), (
                f"{doc['kind']}/{doc['metadata']['name']} container {c['name']}: "
                f"`llmreplay {sub}` has no {f}"
            )


def test_every_command_line_parses(docs, binary):
    """clap parses the expanded line; --help appended stops it before running anything."""
    for doc, c in every_llmreplay_container(docs):
        extra = {"JOB_COMPLETION_INDEX": "0"} if is_indexed_job(doc) else {}
        env = container_env(c, docs, extra)
        if env.get("START_AT") == START_AT_PLACEHOLDER:
            env["START_AT"] = start_at_in(3600)  # what the guide's envsubst/sed puts there
        args = resolved_args(c, env)
        r = run([binary, *args, "--help"], env={**os.environ, **env})
        assert r.returncode == 0, (
            f"{doc['kind']}/{doc['metadata']['name']}: `llmreplay {' '.join(args)}` "
            f"does not parse:\n{r.stderr}"
        )


# ---------------------------------------------------------------------------------------------
# The sharded replay


def test_indexed_job_shards_consistently(docs):
    jobs = find(docs, "Job", is_indexed_job)
    assert len(jobs) == 1, [j["metadata"]["name"] for j in jobs]
    job = jobs[0]
    spec = job["spec"]
    n = spec["completions"]
    assert isinstance(n, int) and n >= 2
    assert spec.get("parallelism") == n, (
        "parallelism != completions: the shards would not all run at once"
    )
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    (c,) = llmreplay_containers(pod_spec(job))
    env = {e["name"]: e for e in c.get("env", [])}
    assert env["LLMREPLAY_SHARDS"].get("value") == str(n), "LLMREPLAY_SHARDS != completions"
    args = c["args"]
    assert args[0] == "replay"
    assert "--shard-from-env" in args and "--shard" not in args
    (start,) = option_value(args, "--start-at")
    m = re.fullmatch(r"\$\((\w+)\)", start)
    assert m, f"--start-at {start}: take it from the env, one value for every shard"
    raw = container_env(c, docs)[m.group(1)]
    assert raw == START_AT_PLACEHOLDER or re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)", raw
    ), f"START_AT {raw!r}: an absolute RFC 3339 time (a +DURATION differs per pod launch)"
    for flag in ("--save-result", "--results"):
        (out,) = option_value(args, flag)
        assert "$(JOB_COMPLETION_INDEX)" in out, f"{flag} {out}: shards would overwrite each other"


def test_sharded_replay_and_merge_run_as_written(docs, binary, tmp_path):
    """The replay Job's N pods and then the merge Job, as processes against a local sim."""
    text = (K8S_DIR / "replay-job.yaml").read_text(encoding="utf-8")
    assert START_AT_PLACEHOLDER in text
    start_at = start_at_in(5)  # whole seconds: 5-6 s to launch N processes on a busy machine
    # What the guide's `sed "s/\${START_AT}/$START_AT/"` / `envsubst '$START_AT'` does:
    replay_docs = load_docs(
        K8S_DIR / "replay-job.yaml", text.replace(START_AT_PLACEHOLDER, start_at)
    )
    others = [d for p, _, d in all_docs() if p.name != "replay-job.yaml"]
    ds = replay_docs + others
    job = find(ds, "Job", is_indexed_job)[0]
    merge_job = find(
        ds, "Job",
        lambda d: not is_indexed_job(d)
        and any(c["args"][0] == "merge" for c in llmreplay_containers(pod_spec(d))),
    )[0]
    n = job["spec"]["completions"]
    roots = {}

    sim_port = free_port()
    sim = subprocess.Popen(
        [str(binary), "sim", "--listen", f"127.0.0.1:{sim_port}", "--fixed-timing", "5,1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    procs = []
    try:
        wait_http(f"http://127.0.0.1:{sim_port}/v1/models", proc=sim)
        spec = pod_spec(job)
        (c,) = llmreplay_containers(spec)
        outputs, trace_made = [], False
        num_prompts = 40
        for k in range(n):
            env = container_env(c, ds, {"JOB_COMPLETION_INDEX": str(k)})
            assert env["START_AT"] == start_at
            args, inputs = map_paths(resolved_args(c, env), c, spec, roots, tmp_path)
            # The endpoint under test -> the local sim (keeping the target's NAME=).
            for i, a in enumerate(args[:-1]):
                if a == "--target":
                    name = args[i + 1].split("=", 1)[0] + "=" if "=" in args[i + 1] else ""
                    args[i + 1] = f"{name}http://127.0.0.1:{sim_port}"
            outputs += option_value(args, "--save-result") + option_value(args, "--results")
            if not trace_made:
                assert len(inputs) == 1, f"expected one trace input, got {inputs}"
                r = run([binary, "synth", "-o", inputs[0], "--num-prompts", num_prompts,
                         "--input-len", 32, "--output-len", 4, "--request-rate", 40, "--seed", 1])
                assert r.returncode == 0, r.stderr
                trace_made = True
            procs.append(
                subprocess.Popen(
                    [str(binary), *args],
                    env={**os.environ, **env},
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        outs = [p.communicate(timeout=90) for p in procs]
        for k, (p, (_, err)) in enumerate(zip(procs, outs)):
            assert p.returncode == 0, f"shard {k} exited {p.returncode}:\n{err}"

        assert len(set(outputs)) == 2 * n, outputs
        missing = [o for o in outputs if not Path(o).is_file()]
        assert not missing, f"not written: {missing}"
        shard_json = [Path(o) for o in outputs if o.endswith(".json")]
        completed = [json.loads(p.read_text())["completed"] for p in shard_json]
        assert len(completed) == n and sum(completed) == num_prompts, completed

        # The merge Job, on the same results volume (a PVC shared by claim name).
        mspec = pod_spec(merge_job)
        (mc,) = llmreplay_containers(mspec)
        margs, _ = map_paths(resolved_args(mc, container_env(mc, ds)), mc, mspec, roots, tmp_path)
        r = run([binary, *margs], timeout=60)
        assert r.returncode == 0, r.stderr
        (out,) = option_value(margs, "--output")
        merged = json.loads(Path(out + ".json").read_text())
        assert merged["completed"] == num_prompts
        assert Path(out + ".parquet").exists()
    finally:
        for p in [*procs, sim]:
            if p.poll() is None:
                p.kill()
                p.wait()


# ---------------------------------------------------------------------------------------------
# The capture sidecar


def _seconds(d):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)?", str(d))
    assert m, f"duration {d!r}"
    return float(m.group(1)) * {"ms": 0.001, "s": 1, None: 1, "m": 60, "h": 3600}[m.group(2)]


def _sleep_prestop(c):
    cmd = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    return float(cmd[1]) if cmd[:1] == ["sleep"] else 0.0


def _port(container, ref):
    """The container's port number that a Service targetPort or probe port names, else None."""
    for p in container.get("ports", []):
        if ref in (p["containerPort"], p.get("name")):
            return p["containerPort"]
    return None


def _host_port(addr):
    host, port = addr.rsplit(":", 1)
    return host, int(port)


def capture_pod(docs):
    for d in docs:
        if d["kind"] == "Deployment":
            cs = [c for c in llmreplay_containers(pod_spec(d)) if c["args"][0] == "capture"]
            if cs:
                return d, cs[0]
    pytest.fail("no Deployment with an llmreplay capture container")


def test_capture_sidecar_is_wired_and_drains(docs):
    dep, cap = capture_pod(docs)
    spec = pod_spec(dep)
    args = cap["args"]
    others = [c for c in spec["containers"] if c is not cap]
    assert others, "the capture sidecar needs a serving container beside it"

    # --upstream: the serving container in the same pod, over localhost.
    (upstream,) = option_value(args, "--upstream")
    m = re.fullmatch(r"http://([^/:]+):(\d+)/?", upstream)
    assert m and m.group(1) in LOCAL_HOSTS[1:], f"--upstream {upstream}: not the pod's own server"
    server_ports = {p["containerPort"] for c in others for p in c.get("ports", [])}
    assert int(m.group(2)) in server_ports, f"--upstream port {m.group(2)} not served in the pod"

    # Service -> the capture listener; the readiness probe -> the admin /readyz (503 while
    # draining and while the upstream cannot be reached).
    (listen,) = option_value(args, "--listen")
    (admin,) = option_value(args, "--admin")
    assert _host_port(listen)[0] == "0.0.0.0" and _host_port(admin)[0] == "0.0.0.0", (
        "--listen and --admin must bind the pod IP (Service, kubelet probes)"
    )
    labels = dep["spec"]["template"]["metadata"]["labels"]
    svcs = [
        s for s in docs
        if s["kind"] == "Service"
        and s["spec"]["selector"].items() <= labels.items()
    ]
    assert svcs, "no Service selects the capture pod"
    targets = [p.get("targetPort", p["port"]) for s in svcs for p in s["spec"]["ports"]]
    assert _host_port(listen)[1] in [_port(cap, t) for t in targets], (
        "no Service port leads to capture's --listen"
    )
    for t in targets:
        assert all(_port(c, t) is None for c in others), f"Service targetPort {t} bypasses capture"
    probe = cap["readinessProbe"]["httpGet"]
    assert probe["path"] == "/readyz"
    assert _port(cap, probe["port"]) == _host_port(admin)[1], "readiness probe is not on --admin"

    # Drain: capture's preStop + --drain-timeout inside the serving container's preStop, all
    # inside the grace period.
    (drain,) = option_value(args, "--drain-timeout") or ["30s"]
    grace = spec.get("terminationGracePeriodSeconds", 30)
    cap_done = _sleep_prestop(cap) + _seconds(drain)
    for c in others:
        assert _sleep_prestop(c) >= cap_done, (
            f"{c['name']} gets SIGTERM before capture has drained "
            f"(preStop {_sleep_prestop(c)} s < {cap_done} s)"
        )
        assert _sleep_prestop(c) < grace
    assert cap_done < grace, f"grace {grace} s < capture preStop + --drain-timeout {cap_done} s"
    for c in spec["containers"]:
        assert "requests" in c.get("resources", {}), f"{c['name']}: no resource requests"


def test_capture_sidecar_command_runs(docs, binary, tmp_path):
    """The sidecar's command line against a local sim standing in for the serving container."""
    dep, cap = capture_pod(docs)
    spec = pod_spec(dep)
    ports = {
        p["containerPort"]: free_port() for c in spec["containers"] for p in c.get("ports", [])
    }
    args, _ = map_paths(resolved_args(cap, container_env(cap, docs)), cap, spec, {}, tmp_path)

    def local(m):
        host, port = m.group(1), int(m.group(2))
        assert port in ports, f"{host}:{port} is no containerPort of the pod"
        return f"127.0.0.1:{ports[port]}"

    args = [re.sub(r"(0\.0\.0\.0|127\.0\.0\.1|localhost):(\d+)", local, a) for a in args]
    (upstream,) = option_value(args, "--upstream")
    (admin,) = option_value(args, "--admin")
    (listen,) = option_value(args, "--listen")
    (out,) = option_value(args, "--out")
    sim = subprocess.Popen(
        [str(binary), "sim", "--listen", upstream.split("://", 1)[1].rstrip("/"),
         "--fixed-timing", "5,1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    proc = None
    try:
        wait_http(f"{upstream.rstrip('/')}/v1/models", proc=sim)
        proc = subprocess.Popen(
            [str(binary), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        probe = cap["readinessProbe"]["httpGet"]
        assert wait_http(f"http://{admin}{probe['path']}", proc=proc) == 200
        body = {"model": "llmreplay-sim", "prompt": "hello there", "max_tokens": 4, "stream": True}
        assert b"[DONE]" in post_json(f"http://{listen}/v1/completions", body)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=_seconds(option_value(args, "--drain-timeout")[0]) + 10)
        assert proc.returncode == 0, f"capture exited {proc.returncode} on SIGTERM:\n{err}"
        files = sorted(Path(out).glob("*.parquet"))
        assert files, f"no Parquet file in {out}: {sorted(Path(out).iterdir())}"
        r = run([binary, "inspect", "--json", *files])
        assert r.returncode == 0, r.stderr
    finally:
        for p in (proc, sim):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


# ---------------------------------------------------------------------------------------------
# A fleet of captures (issue 56): capture-fleet.yaml's pods and link-job.yaml's pass


def fleet_parts(docs):
    (sts,) = [
        d for d in docs
        if d["kind"] == "StatefulSet"
        and any(c["args"][0] == "capture" for c in llmreplay_containers(pod_spec(d)))
    ]
    (cap,) = llmreplay_containers(pod_spec(sts))
    (job,) = [
        d for d in docs
        if d["kind"] == "Job"
        and any(c["args"][0] == "link" for c in llmreplay_containers(pod_spec(d)))
    ]
    (link,) = llmreplay_containers(pod_spec(job))
    return sts, cap, job, link


def test_capture_fleet_is_one_key_and_one_store_the_link_job_reads(docs):
    sts, cap, job, link = fleet_parts(docs)
    args = cap["args"]
    # Each pod its own prefix (by its name), all under one store prefix, which the Job reads.
    (out,) = option_value(args, "--out")
    assert "$(POD_NAME)" in out, f"--out {out}: pods would write over each other"
    env = {e["name"]: e for e in cap.get("env", [])}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    store = out.split("$(POD_NAME)")[0].rsplit("/", 1)[0]
    assert store in link["args"], f"the link Job reads {link['args']}, not {store}"
    # One key for every pod: a Secret, mounted read-only, named by --hash-key-file.
    (key,) = option_value(args, "--hash-key-file")
    spec = pod_spec(sts)
    ((mount_path, vol, ro),) = [
        m for m in mounts(cap, spec, sts["spec"]["volumeClaimTemplates"])
        if key.startswith(m[0] + "/")
    ]
    assert "secret" in vol and ro, f"{key}: not on a read-only Secret volume ({vol})"
    # What the spool keeps survives the pod: a claim template, not an emptyDir.
    (spool,) = option_value(args, "--spool-dir")
    claims = {t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]}
    assert any(
        m["name"] in claims and spool.startswith(m["mountPath"]) for m in cap["volumeMounts"]
    ), f"--spool-dir {spool} is not on a per-pod claim"
    assert sts["spec"]["serviceName"] in {
        d["metadata"]["name"] for d in docs if d["kind"] == "Service"
    }


def _chat(listen, messages):
    body = {"model": "llmreplay-sim", "messages": messages, "max_tokens": 8, "stream": False}
    answer = post_json(f"http://{listen}/v1/chat/completions", body)
    return json.loads(answer)["choices"][0]["message"]["content"]


def test_capture_fleet_and_link_job_run_as_written(docs, binary, tmp_path):
    """Three pods' command lines (the store a local directory standing in for the bucket),
    a conversation whose turns a load balancer spread over them, then the link Job's command
    line: one trace, every pod's rows, the conversation linked across pods as one capture
    would have linked it."""
    pq = pytest.importorskip("pyarrow.parquet")
    sts, cap, job, link = fleet_parts(docs)
    spec = pod_spec(sts)
    claims = sts["spec"]["volumeClaimTemplates"]
    bucket = tmp_path / "bucket"
    (upstream,) = option_value(cap["args"], "--upstream")
    sim_listen = f"127.0.0.1:{free_port()}"
    sim = subprocess.Popen(
        [str(binary), "sim", "--listen", sim_listen, "--fixed-timing", "2,1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    pods, procs = [], []
    try:
        wait_http(f"http://{sim_listen}/v1/models", proc=sim)
        key_root = None
        for i in range(3):
            name = f"{sts['metadata']['name']}-{i}"
            penv = container_env(cap, docs, {"POD_NAME": name})
            args = resolved_args(cap, penv)
            # The bucket: a local directory (a local --out has no spool: it writes in place).
            j = args.index("--spool-dir")
            args = args[:j] + args[j + 2:]
            args, inputs = map_paths(args, cap, spec, {}, tmp_path / name, claims)
            args = [a.replace("s3://", str(bucket) + "/") for a in args]
            args = [a.replace(upstream.rstrip("/"), f"http://{sim_listen}") for a in args]
            for f in inputs:  # the Secret's key: the same bytes in every pod
                f.parent.mkdir(parents=True, exist_ok=True)
                f.write_text("3f" * 32 + "\n")
                key_root = f
            listen = f"127.0.0.1:{free_port()}"
            admin = f"127.0.0.1:{free_port()}"
            args = [
                listen if a == "0.0.0.0:8080" else admin if a == "0.0.0.0:9464" else a
                for a in args
            ]
            p = subprocess.Popen(
                [str(binary), *args], env={**os.environ, **penv},
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            procs.append(p)
            assert wait_http(f"http://{admin}/readyz", proc=p) == 200
            pods.append((name, listen))
        assert key_root is not None, "no --hash-key-file input mapped"
        # A conversation, each turn through the next pod (round-robin), then one-off requests.
        messages = [{"role": "user", "content": "plan a trip to Lisbon"}]
        for turn in range(3):
            answer = _chat(pods[turn % 3][1], messages)
            messages += [
                {"role": "assistant", "content": answer},
                {"role": "user", "content": f"and on day {turn + 2}?"},
            ]
        for _, listen in pods:
            _chat(listen, [{"role": "user", "content": f"unrelated question {listen}"}])
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            _, err = p.communicate(timeout=60)
            assert p.returncode == 0, f"capture exited {p.returncode}:\n{err}"

        largs = resolved_args(link, container_env(link, docs))
        largs, _ = map_paths(largs, link, pod_spec(job), {}, tmp_path / "job")
        largs = [a.replace("s3://", str(bucket) + "/") for a in largs]
        (linked,) = option_value(largs, "--out")
        r = run([binary, *largs], timeout=120)
        assert r.returncode == 0, r.stderr
        t = pq.read_table(linked).to_pylist()
        assert len(t) == 6, t
        assert {row["capture_id"] for row in t} == {n for n, _ in pods}
        t.sort(key=lambda row: row["arrival_time"])
        conv, others = t[:3], t[3:]
        assert [row["capture_id"] for row in conv] == [n for n, _ in pods]
        assert conv[0]["parent_request_id"] is None
        for prev, row in zip(conv, conv[1:]):
            assert row["parent_request_id"] == prev["request_id"], (prev, row)
        assert len({row["session_id"] for row in conv}) == 1
        assert all(row["parent_request_id"] is None for row in others), others
        # Each pod alone could not link them: the pass did.
        raw = [
            row for f in sorted(bucket.rglob("*.parquet")) for row in pq.read_table(f).to_pylist()
        ]
        assert len(raw) == 6
        by_id = {row["request_id"]: row for row in raw}
        assert all(by_id[row["request_id"]]["parent_request_id"] is None for row in conv[1:])
    finally:
        for p in [*procs, sim]:
            if p.poll() is None:
                p.kill()
                p.wait()
