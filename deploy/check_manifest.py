#!/usr/bin/env python3
"""Checks deploy/k8s/check-job.yaml without a cluster, and optionally runs its ranks.

What a cluster would need for the job to meet, checked field by field:
- an indexed Job (completionMode Indexed) whose completions and parallelism are equal, that
  never restarts a pod on its own, and whose pods get DNS names (subdomain = a headless
  Service in the same file, selecting the Job's pods by the label the Job controller sets);
- the variables collectix reads for that launcher row (docs/deployment.md): WORLD_SIZE equal
  to the completions, MASTER_ADDR naming pod 0 (<job>-0.<subdomain>), MASTER_PORT one of the
  Service's ports and a container port, COLLECTIX_SECRET taken from a Secret (without a
  secret the ranks listen on loopback only);
- a command that deploy/Dockerfile puts in the image.

With --run EXE, it then starts the Job's ranks as local processes of EXE with exactly the
variables the manifest gives them (and JOB_COMPLETION_INDEX, as Kubernetes sets it), pod 0's
name replaced by 127.0.0.1 and the port by a free one, and checks that every rank exits 0.

Usage: deploy/check_manifest.py [MANIFEST] [--dockerfile FILE] [--run EXE]
"""
import argparse
import os
import re
import secrets
import socket
import subprocess
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))


def fail(why):
    print(f"check_manifest: {why}", file=sys.stderr)
    sys.exit(1)


def need(cond, why):
    if not cond:
        fail(why)


def check(manifest, dockerfile):
    with open(manifest) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    jobs = [d for d in docs if d.get("kind") == "Job"]
    services = [d for d in docs if d.get("kind") == "Service"]
    need(len(jobs) == 1, f"{manifest}: expected one Job, found {len(jobs)}")
    job = jobs[0]
    need(job.get("apiVersion") == "batch/v1", "the Job's apiVersion is not batch/v1")
    name = job["metadata"]["name"]
    spec = job["spec"]
    need(spec.get("completionMode") == "Indexed",
         "completionMode is not Indexed: the pods get no JOB_COMPLETION_INDEX (their rank)")
    n = spec.get("completions")
    need(isinstance(n, int) and n > 0, "completions is not a positive number")
    need(spec.get("parallelism") == n,
         f"parallelism {spec.get('parallelism')} is not completions {n}: every rank must run at once")
    pod = spec["template"]["spec"]
    need(pod.get("restartPolicy") == "Never",
         "restartPolicy is not Never: a restarted rank would rejoin as a new process")
    sub = pod.get("subdomain")
    need(sub, "the pods have no subdomain: pod 0 has no DNS name for MASTER_ADDR")
    svc = [s for s in services if s["metadata"]["name"] == sub]
    need(svc, f"no Service named {sub} (the pods' subdomain) in {manifest}")
    svc = svc[0]["spec"]
    need(svc.get("clusterIP") == "None", f"Service {sub} is not headless (clusterIP: None)")
    selector = svc.get("selector") or {}
    labels = dict(spec["template"].get("metadata", {}).get("labels", {}))
    labels.setdefault("job-name", name)  # set by the Job controller
    labels.setdefault("batch.kubernetes.io/job-name", name)
    need(selector and all(labels.get(k) == v for k, v in selector.items()),
         f"Service {sub}'s selector {selector} does not select the Job's pods {labels}")
    containers = pod["containers"]
    need(len(containers) == 1, "expected one container per pod (one rank)")
    c = containers[0]
    env = {e["name"]: e for e in c.get("env", [])}
    for v in ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "COLLECTIX_SECRET"):
        need(v in env, f"the container does not set {v}")
    need(env["WORLD_SIZE"].get("value") == str(n),
         f"WORLD_SIZE {env['WORLD_SIZE'].get('value')} is not completions {n}")
    want = f"{name}-0.{sub}"
    addr = env["MASTER_ADDR"].get("value", "")
    need(addr == want or addr.startswith(want + "."),
         f"MASTER_ADDR {addr} is not pod 0's name {want}")
    port = int(env["MASTER_PORT"].get("value", "0"))
    need(port in [p.get("port") for p in svc.get("ports", [])],
         f"MASTER_PORT {port} is not a port of Service {sub}")
    need(port in [p.get("containerPort") for p in c.get("ports", [])],
         f"MASTER_PORT {port} is not a container port")
    need("secretKeyRef" in env["COLLECTIX_SECRET"].get("valueFrom", {}),
         "COLLECTIX_SECRET is not taken from a Secret")
    with open(dockerfile) as f:
        copied = re.findall(r"^COPY --from=\S+ \S+ (\S+)", f.read(), re.M)
    cmd = (c.get("command") or [None])[0]
    need(cmd in copied, f"the command {cmd} is not in the image ({dockerfile} copies {copied})")
    plain = {k: e["value"] for k, e in env.items() if "value" in e}
    return n, plain, want, port


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(exe, n, env, pod0, port):
    base = {k: v for k, v in os.environ.items()
            if k not in ("RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
                         "SLURM_PROCID", "PET_NODE_RANK", "LWS_WORKER_INDEX")}
    local_port = str(free_port())
    secret = secrets.token_hex(16)
    procs = []
    for i in range(n):
        e = dict(base)
        for k, v in env.items():
            e[k] = v.replace(pod0, "127.0.0.1") if k == "MASTER_ADDR" else v
        e["MASTER_PORT"] = local_port if env.get("MASTER_PORT") == str(port) else env["MASTER_PORT"]
        e["JOB_COMPLETION_INDEX"] = str(i)
        e["COLLECTIX_SECRET"] = secret
        procs.append(subprocess.Popen([exe], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    bad = False
    for i, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            print(f"pod {i}: still running after 300 s")
            bad = True
        sys.stdout.write(out)
        if p.returncode != 0:
            print(f"pod {i}: exit status {p.returncode}")
            bad = True
    if bad:
        fail("the Job's ranks did not all succeed")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("manifest", nargs="?", default=os.path.join(HERE, "k8s", "check-job.yaml"))
    ap.add_argument("--dockerfile", default=os.path.join(HERE, "Dockerfile"))
    ap.add_argument("--run", metavar="EXE")
    a = ap.parse_args()
    n, env, pod0, port = check(a.manifest, a.dockerfile)
    print(f"check_manifest: {a.manifest}: an indexed Job of {n} ranks, store at {pod0}:{port}")
    if a.run:
        run(a.run, n, env, pod0, port)
        print(f"check_manifest: {n} local processes with the manifest's variables all succeeded")


if __name__ == "__main__":
    main()
