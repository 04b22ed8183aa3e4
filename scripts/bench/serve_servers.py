"""scripts/bench/bench_serve.py's servers: starting and stopping `kvgpt serve` and `llama-server`, their
command lines, and what the report says about the machine and the binaries. Also imported by
scripts/fleet/ (HOST, free_port, http_get, version_of, ...)."""

import http.client
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HOST = "127.0.0.1"
NAMES = {"kvgpt": "kvgpt", "llama": "llama.cpp"}
BUSY_COMMANDS = {"cargo", "rustc", "cc1", "cc1plus", "ld", "lld", "mold"}


def log(msg):
    print(f"[bench_serve] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- servers

def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def http_get(port, path, timeout=5.0):
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    finally:
        conn.close()


class Server:
    """One server process, its log file, and its port."""

    def __init__(self, key, cmd, port, logdir):
        self.key, self.cmd, self.port = key, cmd, port
        self.log_path = Path(logdir) / f"{key}.log"
        self.proc = None

    def log_tail(self, lines=15):
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def start(self, timeout):
        log(f"starting {NAMES[self.key]}: {' '.join(self.cmd)}")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{NAMES[self.key]} exited with {self.proc.returncode} while starting:\n"
                                   f"{self.log_tail()}")
            if self.port == 0:  # kvgpt --port 0: the chosen port is on its stderr
                m = re.search(r"listening on http://[0-9.]+:(\d+)", self.log_path.read_text(errors="replace"))
                if m:
                    self.port = int(m.group(1))
            if self.port:
                try:
                    status, _ = http_get(self.port, "/health", timeout=2.0)
                    if status == 200:
                        log(f"{NAMES[self.key]} ready on {HOST}:{self.port}")
                        return
                except (OSError, http.client.HTTPException):
                    pass
            time.sleep(0.2)
        raise RuntimeError(f"{NAMES[self.key]} did not answer /health with 200 within {timeout:.0f} s:\n"
                           f"{self.log_tail()}")

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                log(f"{NAMES[self.key]} did not exit 30 s after SIGTERM; killing it")
                self.proc.kill()
                self.proc.wait(timeout=10)
        log(f"{NAMES[self.key]} stopped (exit code {self.proc.returncode})")
        self._log.close()
        self.proc = None


def kvgpt_cmd(a):
    parallel = [] if a.parallel is None else ["--parallel", str(a.parallel)]  # None: the server's default
    return [a.kvgpt, "serve", "--model", a.model, "--host", HOST, "--port", "0", "-t", str(a.threads),
            *parallel, "--cache-mb", str(a.cache_mb), *a.kvgpt_arg]


def llama_cmd(a, port):
    slots = 16 if a.parallel is None else a.parallel
    cmd = [a.llama_server, "-m", a.gguf, "--host", HOST, "--port", str(port), "-t", str(a.threads),
           "-tb", str(a.threads), "-np", str(slots), "-c", str(slots * a.ctx_per_slot),
           "--no-kv-unified", "--cont-batching", "--cache-prompt", "--no-webui",
           "--cache-ram", str(a.llama_cache_ram if a.llama_cache_ram is not None else a.cache_mb)]
    if a.llama_kv != "default":
        cmd += ["-ctk", a.llama_kv, "-ctv", a.llama_kv]
    return cmd + a.llama_arg


def version_of(cmd):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"? ({e})"
    text = (p.stdout + "\n" + p.stderr).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    keep = [ln for ln in lines if re.search(r"version|commit|kvgpt \d", ln, re.I)] or lines[:1]
    return "; ".join(keep[:2]) or "?"


def git_rev(path):
    try:
        root = Path(path).resolve().parent
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        if rev.returncode != 0:
            return None
        return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def busy_processes():
    """Names of compilers etc. running now (their load would distort the numbers)."""
    found = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                name = (d / "comm").read_text().strip()
            except OSError:
                continue
            if name in BUSY_COMMANDS:
                found.add(name)
    return sorted(found)
