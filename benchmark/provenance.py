"""Where a run's numbers came from: package versions, the project's git commit, the machine.

`run_provenance` goes into config.json (with the verified data checksums and what the
driver and each client actor report of their process: `describe_process`); the sweep
report lists the commits and hardware of its runs (`commit_label`, `hardware_label`);
`peak_memory` is what each process reports of its memory at the run's end (summary.json).
"""
from __future__ import annotations

import os
import platform
import socket
import subprocess
from importlib import metadata

from benchmark.data import PROJECT_ROOT

# opacus: DP-SGD (FedPLVM's Table 11); None where a package is not installed (the GPU machine has no Ray or W&B)
PACKAGES = ("torch", "torchvision", "lightning", "ray", "wandb", "finch-clust", "opacus", "numpy")


def package_versions() -> dict[str, str | None]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_state() -> dict:
    """The project's commit and whether its code differs from it (None outside a git checkout). Run outputs under
    results/ do not count: a sweep's own new run folders would otherwise mark every later run of it dirty."""
    def git(*args):
        return subprocess.run(["git", "-C", str(PROJECT_ROOT), *args], capture_output=True, text=True, timeout=60)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode:
            return {"commit": None, "dirty": None}
        status = git("status", "--porcelain", "--", ".", ":(exclude)results")
        return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# the x86 processor flags (as Linux's /proc/cpuinfo names them) of native bfloat16 arithmetic: AVX512-BF16's dot
# products and conversions, AMX's bfloat16 tiles; without either, a CPU's bfloat16 kernels convert to float32 and back
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


# the processor flags to assume instead of the machine's, where set (space- or comma-separated; empty: none): the tests'
# way to tell every process they start (sweep workers, subprocesses, Ray workers: all inherit it) which processor to
# assume, so the suite's runs pick the same precision under `--precision auto` on any machine
CPU_FLAGS_ENV = "BENCH_CPU_FLAGS"


def cpu_flags() -> set[str]:
    """The processor's feature flags, from /proc/cpuinfo's first `flags` line; none where there is no such file;
    $BENCH_CPU_FLAGS's (`CPU_FLAGS_ENV`) where it is set."""
    if (assumed := os.environ.get(CPU_FLAGS_ENV)) is not None:
        return set(assumed.replace(",", " ").split())
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def native_bf16(flags: set[str]) -> bool:
    """Whether a processor with these flags (`cpu_flags`) computes in bfloat16 natively (`NATIVE_BF16_FLAGS`)."""
    return any(f in flags for f in NATIVE_BF16_FLAGS)


def describe_process(device) -> dict:
    """This process's machine: host, pid, CPU model and count, torch's CPU threads, the machine's 1-minute load
    average when the run started (what else ran beside it), the torch device and its GPU model. The threads and
    the load make run times comparable across sessions: a sweep worker of `--parallel 2` on 2 cores trains on 1."""
    import torch

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {"host": socket.gethostname(), "pid": os.getpid(), "cpu": cpu_model(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "load_1min": round(os.getloadavg()[0], 2),
            "device": str(device), "gpu": gpu,
            "visible_gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0}


def peak_memory(device) -> dict:
    """This process's peak memory since the run started (`reset_peak_memory`), in MiB: its resident set, and on CUDA
    the most torch held allocated on the device; what decides how many runs fit a machine (`--parallel`). Where
    the resident peak cannot be reset (not Linux), it is the process's whole life's."""
    import resource
    import sys

    import torch

    try:  # Linux: VmHWM, the peak `reset_peak_memory` resets (getrusage's keeps any peak a thread exited after)
        with open("/proc/self/status") as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 2**10
    except (OSError, StopIteration):
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**20 if sys.platform == "darwin" else 2**10)
    cuda = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    return {"pid": os.getpid(), "peak_rss_mib": round(rss, 1), "cuda_peak_allocated_mib": cuda and round(cuda, 1)}


def reset_peak_memory(device) -> None:
    """Start `peak_memory`'s counts from now: the resident peak from the resident set now (Linux: `5` written to
    `/proc/self/clear_refs` resets VmHWM, kernels 4.0 on), the CUDA peak from what is allocated now."""
    import torch

    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # not Linux: the resident peak stays the process's whole life's
        pass
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def run_provenance(data_checksums: dict[str, str], processes: dict) -> dict:
    return {"packages": package_versions(), "git": git_state(), "data_sha256": data_checksums, **processes}


def commit_label(prov: dict | None) -> str:
    g = (prov or {}).get("git") or {}
    if not g.get("commit"):
        return "unknown commit"
    return g["commit"][:12] + (" (dirty tree)" if g.get("dirty") else "")


def hardware_label(prov: dict | None) -> str:
    """E.g. `2 x NVIDIA H100 (client actors), CPU AMD EPYC 9654 x 16`."""
    prov = prov or {}
    procs = [prov["driver"], *prov["actors"]] if prov.get("driver") else []
    if not procs:
        return "unknown hardware"
    gpus = sorted({p["gpu"] for p in procs if p.get("gpu")})
    cpus = sorted({f"{p['cpu']} x {p['cpu_count']}" for p in procs})
    hosts = len({p["host"] for p in procs})
    gpu_s = f"GPU {', '.join(gpus)}; " if gpus else "no GPU; "
    return f"{gpu_s}CPU {', '.join(cpus)}; {hosts} host{'s' if hosts > 1 else ''}"
