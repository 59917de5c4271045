"""The read-only guard of ``incr serve``, a Spark session extension written in Java.

A BI user connected to the endpoint may only read: Spark's Thrift server has no
authorization of its own (any client could ``DROP``, ``INSERT OVERWRITE DIRECTORY`` or read
``text.`/etc/passwd```), so a check rule (``ReadOnlyGuard.java``, beside this module) refuses,
on every session but the server's own, each statement that is not a read of the served
folders (see the Java class for the list).  Spark runs check rules after analysis and before
execution, so a refused statement does nothing.

The class is compiled at the server's start with the JDK's ``javac`` against pyspark's own
jars (about 2 s), so it always matches the Spark it runs in; a machine without a JDK gets a
clear error naming the package to install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from incr.errors import IncrError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The extension's class (``spark.sql.extensions``).
GUARD_CLASS = "incr.serving.ReadOnlyGuard"
SOURCE = Path(__file__).with_name("ReadOnlyGuard.java")


def _javac() -> str:
    home = os.environ.get("JAVA_HOME")
    candidates = [str(Path(home) / "bin" / "javac")] if home else []
    candidates.append(shutil.which("javac") or "")
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    raise IncrError("incr serve needs a JDK (javac) to build its read-only guard, and found none; "
                    "install one (Debian: apt-get install openjdk-17-jdk-headless; `make install` "
                    "does) or set JAVA_HOME to it")


def build_guard(into: Path) -> Path:
    """Compiles the guard into ``into`` (a classes folder, for ``spark.driver.extraClassPath``).

    Raises:
        IncrError: no JDK, or the class does not compile against this Spark.
    """
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    into.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([_javac(), "-proc:none", "-nowarn", "-d", str(into), "-cp", f"{jars}/*",
                           str(SOURCE)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise IncrError(f"the read-only guard of incr serve did not compile against the Spark in "
                        f"{jars}:\n{done.stderr[-2000:]}")
    return into


def guard_conf(classes: Path, extensions: str | None) -> dict[str, str]:
    """The Spark settings that load the guard (after any extensions already asked for)."""
    return {"spark.sql.extensions": ",".join(e for e in (extensions, GUARD_CLASS) if e),
            "spark.driver.extraClassPath": str(classes),
            # one session per client: the server's own is the only one trusted
            "spark.sql.hive.thriftServer.singleSession": "false"}


def arm(spark: SparkSession, readable: list[Path]) -> None:
    """Trusts ``spark``, the server's own session, and lets clients read under ``readable``.

    Raises:
        IncrError: the guard is not among the session's extensions.
    """
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    guard = jvm.incr.serving.ReadOnlyGuard
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    if GUARD_CLASS not in extensions.split(","):
        raise IncrError("the read-only guard is not among spark.sql.extensions; incr serve refuses "
                        "to serve without it")
    guard.trust(spark._jsparkSession)
    guard.allow("\n".join(str(p.resolve()) for p in readable))
