"""A real `peagle-vllm serve` subprocess on 127.0.0.1 for tests and scripts: start, wait healthy, stop,
and read its Prometheus `/metrics`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
LOG_TAIL_CHARS = 4000


@dataclass(frozen=True)
class ServerConfig:
    """What to serve: the target, its optional speculative config, and where the server logs."""

    target: Path
    log: Path
    name: str = "demo"
    max_model_len: int = 2048
    speculative_config: dict | None = None
    kv_cache_space_gib: int = 1
    enforce_eager: bool = True  # False: the target compiled, as `vllm serve` runs it by default
    env: Mapping[str, str] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()  # further `vllm serve` arguments, e.g. ("--num-gpu-blocks-override", "48")


@dataclass(frozen=True)
class Server:
    """A started, healthy server: its base URL (no `/v1`), process id and log file."""

    config: ServerConfig
    base_url: str
    pid: int

    @property
    def log(self) -> Path:
        """The server's combined stdout/stderr log."""
        return self.config.log


def _free_ports(n: int) -> list[int]:
    """`n` distinct free TCP ports on 127.0.0.1 (sockets held open together so none repeats)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def server_env(config: ServerConfig) -> dict[str, str]:
    """This process's environment for a server: multiprocess engine, small KV cache, offline hub."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env.update(VLLM_CPU_KVCACHE_SPACE=str(config.kv_cache_space_gib), HF_HUB_OFFLINE="1", **config.env)
    return env


def serve_command(config: ServerConfig, port: int) -> list[str]:
    """The `python -m peagle_vllm.cli serve ...` argument list for `config` on `port`."""
    cmd = [sys.executable, "-m", "peagle_vllm.cli", "serve", str(config.target), "--host", "127.0.0.1",
           "--port", str(port), "--dtype", "float32", "--max-model-len", str(config.max_model_len),
           "--served-model-name", config.name] + (["--enforce-eager"] if config.enforce_eager else [])
    if config.speculative_config is not None:
        cmd += ["--speculative-config", json.dumps(config.speculative_config)]
    return cmd + list(config.extra_args)


def log_tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    """The last `chars` characters of a log file (for failure messages)."""
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


def is_healthy(base_url: str, timeout_s: float = 5.0) -> bool:
    """Whether GET /health answers 200."""
    try:
        with urllib.request.urlopen(base_url + "/health", timeout=timeout_s) as r:
            return r.status == 200
    except OSError:
        return False


def _stop(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to the server's process group, then SIGKILL if it has not exited within `grace_s`."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    try:  # the engine-core child may outlive the API server; it is in the same group
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@contextmanager
def running_servers(*configs: ServerConfig, startup_timeout_s: float = 300.0,
                    stop_grace_s: float = 30.0) -> Iterator[list[Server]]:
    """Starts all servers at once (start-ups overlap), waits until each is healthy, stops them all on exit."""
    with ExitStack() as stack:
        procs = []
        for config, port in zip(configs, _free_ports(len(configs))):
            config.log.parent.mkdir(parents=True, exist_ok=True)
            log = stack.enter_context(open(config.log, "w"))
            proc = subprocess.Popen(serve_command(config, port), env=server_env(config), stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            stack.callback(_stop, proc, stop_grace_s)
            procs.append((config, proc, f"http://127.0.0.1:{port}"))
        deadline = time.monotonic() + startup_timeout_s
        for config, proc, base in procs:
            while not is_healthy(base, timeout_s=2.0):
                if proc.poll() is not None:
                    raise RuntimeError(f"server {base} exited with {proc.returncode}; {config.log}:\n"
                                       + log_tail(config.log))
                if time.monotonic() > deadline:
                    raise RuntimeError(f"server {base} not healthy in {startup_timeout_s:.0f} s; {config.log}:\n"
                                       + log_tail(config.log))
                time.sleep(1.0)
        yield [Server(config, base, proc.pid) for config, proc, base in procs]


@contextmanager
def running_server(config: ServerConfig, startup_timeout_s: float = 300.0) -> Iterator[Server]:
    """One server, started, healthy, and stopped on exit."""
    with running_servers(config, startup_timeout_s=startup_timeout_s) as (server,):
        yield server


def scrape_metrics(base_url: str) -> dict[str, float]:
    """Every series on /metrics summed over its labels, keyed by sample name (e.g. `..._total`)."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{")[0].split(" ")[0]
            totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[-1])
    return totals


def metric(base_url: str, name: str) -> float:
    """One gauge or counter from /metrics (summed over labels), e.g. `vllm:kv_cache_usage_perc`."""
    values = scrape_metrics(base_url)
    if name not in values:
        raise KeyError(f"{name} is not on {base_url}/metrics")
    return values[name]


def wait_until_idle(base_url: str, timeout_s: float = 30.0) -> dict[str, float]:
    """Polls /metrics until no request is running or waiting; returns that scrape (TimeoutError if never)."""
    deadline = time.monotonic() + timeout_s
    while True:
        values = scrape_metrics(base_url)
        if values["vllm:num_requests_running"] == 0 and values["vllm:num_requests_waiting"] == 0:
            return values
        if time.monotonic() > deadline:
            raise TimeoutError(f"{base_url}: still {values['vllm:num_requests_running']:.0f} running and "
                               f"{values['vllm:num_requests_waiting']:.0f} waiting after {timeout_s:.0f} s")
        time.sleep(0.5)


async def peak_during(base_url: str, name: str, work: Awaitable[T], interval_s: float = 0.5) -> tuple[T, float]:
    """Awaits `work` while polling metric `name`; (work's result, the highest value seen), to show a gauge moved."""
    task = asyncio.ensure_future(work)
    peak = await asyncio.to_thread(metric, base_url, name)
    while not task.done():
        await asyncio.wait([task], timeout=interval_s)
        peak = max(peak, await asyncio.to_thread(metric, base_url, name))
    return task.result(), peak
