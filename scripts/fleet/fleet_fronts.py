#!/usr/bin/env python3
"""scripts/fleet/fleet.py's fronts: vllm-router (a fresh router per cell, pip-installed into a venv when
missing) and nginx (one process, an upstream and a port per policy; apt-get installs it when
missing). Imports fleet_procs (processes, HTTP helpers) and neither fleet.py nor fleet_cells.py."""

import http.client
import os
import pwd
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))  # bench_serve's modules
import serve_servers  # noqa: E402
from fleet_procs import HOST, ROUTER_VERSION, Proc, StartError, log  # noqa: E402


class VllmRouter:
    """A fresh vllm-router per cell, in front of the replicas."""

    kind = "vllm-router"

    def __init__(self, a, replicas, logdir):
        self.a, self.replicas, self.logdir = a, replicas, logdir
        self.proc = None
        self.binary = ensure_vllm_router(a)
        self.version = version_of_pip(a.router_venv, "vllm-router")
        self.runs = 0

    def describe(self):
        return (f"vllm-router {self.version} (`--health-check-interval-secs 1 --health-failure-threshold 2 "
                f"--health-success-threshold 1`" + (f" {' '.join(self.a.router_arg)}" if self.a.router_arg else "")
                + "), a fresh router per cell; kv_aware with the replicas' KV-event endpoints given")

    def begin(self, policy, timeout):
        self.runs += 1
        self.port, self.prom = serve_servers.free_port(), serve_servers.free_port()
        cmd = [str(self.binary), "--worker-urls", *[r.url for r in self.replicas], "--policy", policy,
               "--host", HOST, "--port", str(self.port), "--prometheus-host", HOST, "--prometheus-port", str(self.prom),
               "--health-check-interval-secs", "1", "--health-failure-threshold", "2",
               "--health-success-threshold", "1", "--worker-startup-check-interval", "1"]
        if policy == "kv_aware":
            for r in self.replicas:
                cmd += ["--kv-event-source", f"{r.url}={r.events}", "--kv-event-replay-source", f"{r.url}={r.replay}"]
            cmd += ["--kv-event-model", self.a.served_name]
        cmd += self.a.router_arg
        self.proc = Proc(f"vllm-router.{self.runs}.{policy}", cmd, self.logdir, self.port)
        self.proc.start()
        self.proc.wait_http("/health", timeout)
        if policy == "kv_aware":  # until every replica's event subscriber runs
            deadline = time.monotonic() + 30
            while self.proc.log_text().count("kv_index subscriber for") < len(self.replicas):
                if time.monotonic() > deadline:
                    raise StartError(f"{self.proc.name}: no KV-event subscribers after 30 s:\n{self.proc.log_tail()}")
                time.sleep(0.1)
            time.sleep(0.5)
        return self.port

    def end(self):
        if self.proc:
            self.proc.stop()
            self.proc = None

    def headers(self, req):
        return {"X-Session-Id": f"g{req['group']}"}

    def _prom(self):
        try:
            status, text = serve_servers.http_get(self.prom, "/metrics", timeout=5.0)
        except (OSError, http.client.HTTPException):
            return None
        return text if status == 200 else None

    def mark(self):
        return self.counters()

    def counters(self):
        text = self._prom()
        out = {}
        if text is None:
            return out
        for line in text.splitlines():
            if line.startswith("vllm_router_") and not line.startswith("#") and "_bucket" not in line:
                key, _, v = line.rpartition(" ")
                try:
                    out[key] = float(v)
                except ValueError:
                    pass
        return out

    def retries_since(self, mark):
        now = self.counters()
        return int(sum(v - mark.get(k, 0) for k, v in now.items() if k.startswith("vllm_router_retries_total")))

    def router_deltas(self, mark):
        now = self.counters()
        keep = ("vllm_router_retries", "vllm_router_request_errors_total", "vllm_router_prefix_routing_decisions_total",
                "vllm_router_cb_outcomes_total", "vllm_router_cb_state_transitions_total")
        return {k: v - mark.get(k, 0) for k, v in now.items() if k.startswith(keep) and v - mark.get(k, 0)}

    def worker_healthy(self, r):
        text = self._prom()
        if text is None:
            return None
        m = re.search(r'vllm_router_worker_health\{worker="' + re.escape(r.url) + r'"\} (\S+)', text)
        return None if m is None else float(m.group(1)) > 0

    def stop(self):
        self.end()


class Nginx:
    """One nginx process: an upstream (and a port) per policy."""

    kind = "nginx"

    def __init__(self, a, replicas, logdir):
        self.a, self.replicas = a, replicas
        self.binary = ensure_nginx()
        self.version = (serve_servers.version_of([self.binary, "-v"]).split("/")[-1] or "?").strip()
        self.dir = Path(logdir) / "nginx"
        self.dir.mkdir()
        for sub in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (self.dir / sub).mkdir()
        self.ports = {p: serve_servers.free_port() for p in ("consistent_hash", "round_robin")}
        self.access = self.dir / "access.log"
        conf = self.dir / "nginx.conf"
        conf.write_text(self.config())
        err = self.dir / "error.log"
        base = [self.binary, "-e", str(err), "-p", str(self.dir), "-c", str(conf)]
        test = subprocess.run(base + ["-t"], capture_output=True, text=True, timeout=30)
        if test.returncode != 0:
            raise StartError(f"nginx -t rejected {conf}:\n{test.stdout}{test.stderr}")
        self.proc = Proc("nginx", base + ["-g", "daemon off;"], logdir, self.ports["round_robin"])
        self.proc.start()
        self.proc.wait_http("/health", 30)
        log(f"nginx {self.version} on {', '.join(f'{p} :{port}' for p, port in self.ports.items())}")

    def config(self):
        d = self.dir
        servers = "\n".join(f"        server {r.url[len('http://'):]} max_fails=1 fail_timeout=2s;" for r in self.replicas)
        user = f"user {pwd.getpwuid(os.geteuid()).pw_name};\n" if os.geteuid() == 0 else ""
        return f"""# scripts/fleet/fleet.py: nginx in front of {len(self.replicas)} kvgpt serve replicas (loopback only)
{user}worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    log_format fleet '$msec $server_port $status "$upstream_addr" "$upstream_status" $request_time '
                     'session=$http_x_session_id';
    access_log {d}/access.log fleet;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    client_max_body_size 64m;
    client_body_buffer_size 1m;

    # consistent_hash: the requests of one shared-prefix group (one X-Session-Id) go to one replica
    upstream kvgpt_hash {{
        hash $http_x_session_id consistent;
{servers}
        keepalive 32;
    }}
    # round_robin: the baseline
    upstream kvgpt_rr {{
{servers}
        keepalive 32;
    }}

    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_set_header Host localhost;        # kvgpt on loopback answers only loopback host names
    proxy_buffering off;                    # SSE: every chunk as it comes
    proxy_cache off;
    proxy_connect_timeout 2s;
    proxy_read_timeout 600s;
    proxy_send_timeout 600s;
    # a dead replica (error), or a draining one (503), sends the request to the next; POSTs too
    proxy_next_upstream error timeout http_503 non_idempotent;
    proxy_next_upstream_tries 0;

    server {{
        listen {HOST}:{self.ports['consistent_hash']};
        location / {{ proxy_pass http://kvgpt_hash; }}
    }}
    server {{
        listen {HOST}:{self.ports['round_robin']};
        location / {{ proxy_pass http://kvgpt_rr; }}
    }}
}}
"""

    def describe(self):
        return (f"nginx {self.version} (worker_processes 1, `hash $http_x_session_id consistent` or round robin, "
                "max_fails=1 fail_timeout=2s, `proxy_next_upstream error timeout http_503 non_idempotent`, "
                "unbuffered, keep-alive); config and access log in the log folder")

    def begin(self, policy, timeout):
        return self.ports[policy]

    def end(self):
        pass

    def headers(self, req):
        return {"X-Session-Id": f"g{req['group']}"}

    def mark(self):
        try:
            return self.access.stat().st_size
        except OSError:
            return 0

    def _lines(self, mark):
        try:
            with open(self.access, "rb") as f:
                f.seek(mark)
                return f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return []

    def retries_since(self, mark):
        """Requests nginx passed to more than one replica ($upstream_addr lists them, comma-separated)."""
        n = 0
        for line in self._lines(mark):
            m = re.search(r'"([^"]*)"', line)
            if m and "," in m.group(1):
                n += 1
        return n

    def router_deltas(self, mark):
        attempts = 0
        statuses = {}
        for line in self._lines(mark):
            m = re.search(r'"([^"]*)" "([^"]*)"', line)
            if m:
                attempts += len([x for x in m.group(1).split(",") if x.strip()])
                for s in m.group(2).split(","):
                    statuses[s.strip()] = statuses.get(s.strip(), 0) + 1
        return {"upstream_attempts": attempts, "upstream_statuses": statuses}

    def worker_healthy(self, r):
        return None

    def stop(self):
        self.proc.stop()


def version_of_pip(venv, package):
    try:
        p = subprocess.run([str(Path(venv) / "bin" / "python"), "-m", "pip", "show", package], capture_output=True,
                           text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"^Version:\s*(\S+)", p.stdout, re.M)
    return m.group(1) if m else None


def ensure_vllm_router(a):
    venv = Path(a.router_venv)
    binary = venv / "bin" / "vllm-router"
    if binary.exists() and version_of_pip(venv, "vllm-router") == ROUTER_VERSION:
        return binary
    if not (venv / "bin" / "python").exists():
        log(f"creating venv {venv}")
        p = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
        if p.returncode != 0:
            raise StartError(f"python3 -m venv {venv} failed:\n{p.stderr[-2000:]}")
    log(f"pip install vllm-router=={ROUTER_VERSION} into {venv}")
    p = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"vllm-router=={ROUTER_VERSION}"],
                       capture_output=True, text=True, timeout=1800)
    if p.returncode != 0 or not binary.exists():
        raise StartError(f"pip install vllm-router=={ROUTER_VERSION} failed:\n{(p.stdout + p.stderr)[-2000:]}")
    return binary


def ensure_nginx():
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if
                                           os.access(p, os.X_OK)), None)
    if found:
        return found
    if os.geteuid() != 0:
        raise StartError("nginx is not installed and this is not root: apt-get install nginx (Debian's), then rerun")
    log("installing Debian's nginx: apt-get update -qq && apt-get install -y -qq nginx")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    p = subprocess.run("apt-get update -qq && apt-get install -y -qq nginx", shell=True, capture_output=True,
                       text=True, env=env, timeout=1800)
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
    if p.returncode != 0 or not found:
        raise StartError(f"apt-get install nginx failed:\n{(p.stdout + p.stderr)[-2000:]}")
    return found


# ---------------------------------------------------------------- running requests
