"""The machine a benchmark ran on, read at run time (numbers mean little without it)."""

from __future__ import annotations

import os
import platform
import subprocess
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _meminfo_gib() -> float | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        return None
    return None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _java() -> str | None:
    try:
        done = subprocess.run(["java", "-version"], check=False, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[0] if lines else None


def machine_info(spark: SparkSession) -> dict:
    """What the numbers were measured on.

    CPU count and model, memory, Java, Spark, Python, OS, the Spark settings that matter,
    and the load average (another workload on the machine shows up there).
    """
    conf = spark.sparkContext.getConf()
    return {
        "nproc": os.cpu_count(),
        "cpu": _cpu_model(),
        "memory_gib": _meminfo_gib(),
        "java": _java(),
        "spark": spark.version,
        "python": platform.python_version(),
        "os": platform.platform(),
        "spark_master": spark.sparkContext.master,
        "spark_driver_memory": conf.get("spark.driver.memory", None),
        "spark_sql_shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
        "loadavg": list(os.getloadavg()),
    }


def peak_memory_mb(spark: SparkSession | None = None) -> dict[str, float | None]:
    """Peak resident memory so far of this (Python) process and of Spark's driver JVM, in MiB.

    The JVM is a child process (the Py4J gateway); its high-water mark is read from
    ``/proc/<pid>/status`` (VmHWM), None where that is not available.
    """
    import resource

    out: dict[str, float | None] = {
        "python": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "jvm": None}
    try:
        pid = spark.sparkContext._gateway.proc.pid if spark is not None else None  # type: ignore[union-attr]
    except AttributeError:
        pid = None
    if pid:
        try:
            with open(f"/proc/{pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        out["jvm"] = round(int(line.split()[1]) / 1024, 1)
        except OSError:
            pass
    return out
