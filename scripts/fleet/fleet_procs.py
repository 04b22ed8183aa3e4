#!/usr/bin/env python3
"""scripts/fleet/fleet.py's processes: the replicas (`kvgpt serve`), the registry of every process started
(stopped by stop_all at exit), and the HTTP and /metrics helpers. Imports none of the other fleet
modules (fleet_fronts.py has the routers)."""

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))  # bench_serve's modules
import serve_servers  # noqa: E402  (the loopback host, free ports and the HTTP helper)

HOST = serve_servers.HOST
REPO = Path(__file__).resolve().parents[2]
ROUTER_VERSION = "0.1.17"
COMPLETIONS_200 = ("kvgpt_requests_total", {"endpoint": "/v1/completions", "status": "200"})
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def log(msg):
    print(f"[fleet] {msg}", file=sys.stderr, flush=True)


class StartError(RuntimeError):
    """A process could not start (exit status 2)."""


# ---------------------------------------------------------------- processes

PROCS = []  # every process started here, stopped at exit
STOPPING = threading.Event()  # set at exit: no more starts (a restart thread may still be waiting)


class Proc:
    """A process started here, its log (appended to across restarts) and its HTTP port."""

    def __init__(self, name, cmd, logdir, port=None):
        self.name, self.cmd, self.port = name, cmd, port
        self.log_path = Path(logdir) / f"{name}.log"
        self.proc = None
        self._log = None
        PROCS.append(self)

    def start(self):
        if STOPPING.is_set():
            raise StartError(f"{self.name}: not started, the run is ending")
        log(f"starting {self.name}: {' '.join(self.cmd)}")
        if self._log:
            self._log.close()
        self._log = open(self.log_path, "ab")
        self.log_offset = self._log.tell()
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                     cwd=str(REPO))

    def log_text(self, since=0, until=None):
        try:
            with open(self.log_path, "rb") as f:
                f.seek(since)
                data = f.read() if until is None else f.read(max(0, until - since))
                return ANSI.sub("", data.decode("utf-8", "replace"))
        except OSError:
            return ""

    def log_tail(self, lines=15):
        return "\n".join(self.log_text(self.log_offset if self.proc else 0).splitlines()[-lines:])

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def wait_http(self, path, timeout, want=200):
        """Until GET path answers `want` (port 0: first read the port `kvgpt serve` printed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise StartError(f"{self.name} exited with {self.proc.returncode} while starting:\n{self.log_tail()}")
            if not self.port:
                m = re.search(r"listening on http://[0-9.]+:(\d+)", self.log_text(self.log_offset))
                if m:
                    self.port = int(m.group(1))
            if self.port:
                try:
                    if serve_servers.http_get(self.port, path, timeout=2.0)[0] == want:
                        return
                except (OSError, http.client.HTTPException):
                    pass
            time.sleep(0.1)
        raise StartError(f"{self.name}: GET {path} did not answer {want} within {timeout:.0f} s:\n{self.log_tail()}")

    def signal(self, sig):
        if self.alive():
            self.proc.send_signal(sig)

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout=30):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            if self.wait(timeout) is None:
                log(f"{self.name} did not exit {timeout} s after SIGTERM; killing it")
                self.proc.kill()
                self.wait(10)
        if self._log:
            self._log.close()
            self._log = None


def stop_all():
    STOPPING.set()
    for p in reversed(PROCS):
        try:
            p.stop()
        except Exception as e:  # keep stopping the others
            log(f"stopping {p.name}: {e}")


class Replica(Proc):
    """One `kvgpt serve` on fixed ports (a restart binds the same ones)."""

    def __init__(self, i, a, logdir, events):
        self.index = i
        port = serve_servers.free_port()
        self.url = f"http://{HOST}:{port}"
        cmd = replica_cmd(a, port)
        self.events = self.replay = None
        if events:
            self.events, self.replay = (f"tcp://{HOST}:{serve_servers.free_port()}" for _ in range(2))
            cmd += ["--kv-events", self.events, "--kv-events-replay", self.replay]
        super().__init__(f"replica{i}", cmd, logdir, port)
        self.restarts = 0

    def up(self, timeout):
        self.start()
        self.ready(timeout)

    def ready(self, timeout):
        self.wait_http("/health", timeout)
        log(f"{self.name} ready on {self.url}")


def replica_cmd(a, port):
    return [a.kvgpt, "serve", "--model", a.model, "--host", HOST, "--port", str(port), "-t", str(a.replica_threads),
            "--parallel", str(a.parallel), "--cache-mb", str(a.cache_mb), *a.kvgpt_arg]


# ---------------------------------------------------------------- HTTP and metrics

def http_post(port, path, body, timeout=10.0):
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    finally:
        conn.close()


LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def http_text(port, path, timeout=5.0):
    """The body of GET path when it answers 200; None otherwise, or when nothing answers."""
    try:
        status, text = serve_servers.http_get(port, path, timeout=timeout)
    except (OSError, http.client.HTTPException):
        return None
    return text if status == 200 else None


def samples(text):
    """The (`name{labels}`, value) of every sample line of a Prometheus text."""
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                yield key, float(value)
            except ValueError:
                pass


def metrics(port, timeout=5.0):
    """Prometheus text as [(name, {labels}, value)]; None when the server does not answer."""
    text = http_text(port, "/metrics", timeout)
    if text is None:
        return None
    out = []
    for key, v in samples(text):
        name, _, labels = key.partition("{")
        out.append((name, dict(LABEL.findall(labels)), v))
    return out


def metric(ms, name, labels=None):
    """Sum of the samples of `name` whose labels include `labels` (0 if none; None without metrics)."""
    if ms is None:
        return None
    labels = labels or {}
    return sum(v for n, ls, v in ms if n == name and all(ls.get(k) == x for k, x in labels.items()))


def replica_counts(r):
    ms = metrics(r.port)
    if ms is None:
        return None
    return {"served": metric(ms, *COMPLETIONS_200), "refused_503": metric(ms, "kvgpt_requests_total",
                                                                        {"endpoint": "/v1/completions",
                                                                         "status": "503"}),
            "prompt": metric(ms, "kvgpt_prompt_tokens_total"), "cached": metric(ms, "kvgpt_prompt_cached_tokens_total"),
            "running": metric(ms, "kvgpt_requests_running")}


def flush(replicas):
    for r in replicas:
        status, body = http_post(r.port, "/flush_cache", {})
        if status != 200:
            raise RuntimeError(f"{r.name}: POST /flush_cache answered {status}: {body[:300]}")


def snapshot(replicas):
    return {r.index: replica_counts(r) for r in replicas}


def deltas(before, after):
    out = {}
    for i, b in before.items():
        x = after.get(i)
        out[i] = None if b is None or x is None else {k: x[k] - b[k] for k in ("served", "refused_503", "prompt", "cached")}
    return out


# ---------------------------------------------------------------- fronts
