"""docker-compose.yml and infra/: every image, command, path and variable they name is real.

No Docker engine runs here, so the deployment is checked by reading it against what it names:

* images: pinned to an exact tag (never ``latest``), or built from a Dockerfile that exists;
  the versions they carry (Python, Java, and Airflow or Spark where an image names them) are
  the project's, read from pyproject.toml, requirements.lock and the Makefile;
* infra/Dockerfile installs incr as the Makefile does, and every file it copies exists and
  is let through its .dockerignore;
* commands: ``airflow ...`` walks Airflow's own CLI parser (subcommands and options),
  ``incr ...`` is parsed by incr's parser, ``spark-class C`` names a class in pyspark's jars,
  and every executable is installed in the image (the venv's scripts: the image installs the
  same requirements.lock);
* paths: bind-mounted host paths exist, program files named in commands exist behind their
  mounts, DAGs and programs are mounted read-only where dags/incr_programs.py finds them;
* variables: INCR_* are settings of incr.config.Settings, AIRFLOW__SECTION__KEY are options
  of Airflow's configuration, SPARK_* and spark.* keys occur in Spark's own scripts and
  classes, and every ``${VAR}`` compose interpolates is documented in infra/.env.example;
* wiring: depends_on names services (a ``service_healthy`` one has a healthcheck), ports are
  published on 127.0.0.1 only, the workers can be scaled, and every service that runs incr
  or Spark executors runs the one image with the shared volume at the same path.

Airflow's parser and configuration are read in a child process with a throw-away
AIRFLOW_HOME, so no real Airflow home or metadata DB is touched.  Each check is a function
returning its problems; the ``broken`` tests run each on a deliberately broken copy of the
files to show it can fail.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import sysconfig
import tempfile
import tomllib
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
COMPOSE = REPO / "docker-compose.yml"
INFRA = REPO / "infra"

#: Executables of images not built here, and the variables their documentation defines.
EXTERNAL_EXECUTABLES = {"postgres": {"pg_isready", "psql", "postgres"}}
EXTERNAL_VARIABLES = {"postgres": {"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB", "PGDATA",
                                   "POSTGRES_INITDB_ARGS"}}
#: Variables of the built image's own environment that no component's configuration lists.
IMAGE_VARIABLES = {"PATH", "AIRFLOW_HOME", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE",
                   "PIP_DISABLE_PIP_VERSION_CHECK", "PIP_NO_CACHE_DIR"}
#: Airflow components that run incr's code: the scheduler's LocalExecutor runs the tasks, the
#: DAG processor parses the DAG files, the triggerer watches the landing folders.
AIRFLOW_RUNS_INCR = {"scheduler", "dag-processor", "triggerer"}
SPARK_WORKER = "org.apache.spark.deploy.worker.Worker"
SPARK_MASTER = "org.apache.spark.deploy.master.Master"
DEPENDS_CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}


# --- what the deployment is compared with ------------------------------------------------


@dataclass(frozen=True)
class Facts:
    """The project's pins and what its installed packages define."""

    pins: dict[str, str]  # requirements.lock: lower-case name -> version
    python: str  # "3.11", from pyproject's requires-python
    java: str  # "17", from the Makefile
    version: str  # incr's own version (pyproject)
    makefile_pip: list[list[str]]  # arguments of each `pip install` of `make install`
    incr_env: frozenset[str]  # INCR_* variables of incr.config.Settings
    airflow_cli: dict[str, Any]  # {"options": [...], "commands": {name: <same>}}
    airflow_env: frozenset[str]  # AIRFLOW__SECTION__KEY of every configuration option
    spark_classes: dict[str, str]  # class names in pyspark's jars -> the jar's path
    spark_text: bytes  # Spark's scripts and core classes, to find SPARK_* and spark.* names in
    executables: frozenset[str]  # scripts of this environment (the image installs the same)


_AIRFLOW_PROBE = """
import argparse, json, sys
from airflow.cli import cli_parser
from airflow.configuration import retrieve_configuration_description

def walk(parser):
    node = {"options": sorted(o for a in parser._actions for o in a.option_strings), "commands": {}}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            node["commands"] = {name: walk(sub) for name, sub in action.choices.items()}
    return node

env = []
for section, body in retrieve_configuration_description(include_providers=True).items():
    for key, option in (body.get("options") or {}).items():
        name = "AIRFLOW__" + section.replace(".", "_").upper() + "__" + key.upper()
        env.append(name)
        if option.get("sensitive"):
            env += [name + "_CMD", name + "_SECRET"]
with open(sys.argv[1], "w") as out:
    json.dump({"cli": walk(cli_parser.get_parser()), "env": env}, out)
"""


def _airflow_facts() -> tuple[dict[str, Any], frozenset[str]]:
    """Airflow's CLI tree and configuration variables, from a child process and a temporary home."""
    with tempfile.TemporaryDirectory(prefix="incr-infra-airflow-") as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env.update(AIRFLOW_HOME=home, AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
                   AIRFLOW__CORE__LOAD_EXAMPLES="False")
        out = Path(home) / "facts.json"
        done = subprocess.run([sys.executable, "-c", _AIRFLOW_PROBE, str(out)], env=env, cwd=home,
                              capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        data = json.loads(out.read_text())
    return data["cli"], frozenset(data["env"])


def _spark_facts() -> tuple[dict[str, str], bytes]:
    """Class names in pyspark's jars (and their jar), and the text of Spark's scripts and core classes."""
    import pyspark

    home = Path(pyspark.__file__).parent
    classes: dict[str, str] = {}
    text: list[bytes] = [p.read_bytes() for folder in ("bin", "sbin") for p in (home / folder).iterdir()]
    text += [p.read_bytes() for p in home.glob("*.py")]
    for jar in sorted((home / "jars").glob("*.jar")):
        core = jar.name.startswith(("spark-core_", "spark-launcher_", "spark-catalyst_"))
        with zipfile.ZipFile(jar) as z:
            for name in z.namelist():
                if name.endswith(".class"):
                    classes[name[: -len(".class")].replace("/", ".")] = str(jar)
                    if core:
                        text.append(z.read(name))
    return classes, b"\n".join(text)


def _makefile_pip(makefile: str) -> list[list[str]]:
    """The arguments of each ``pip install`` the Makefile runs."""
    return [shlex.split(m.group(1)) for m in re.finditer(r"-m pip install (.+)", makefile)]


def _single(values: set[str], what: str) -> str:
    assert len(values) == 1, f"expected one {what}, found {sorted(values)}"
    return values.pop()


def read_facts() -> Facts:
    """The facts: the project's files, incr's settings, Airflow's CLI and config, pyspark's jars."""
    from incr.config import Settings

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    makefile = (REPO / "Makefile").read_text()
    pins = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and not line.lstrip().startswith("#"):
            pins[name.strip().lower()] = version.strip()
    airflow_cli, airflow_env = _airflow_facts()
    spark_classes, spark_text = _spark_facts()
    return Facts(
        pins=pins,
        python=_single(set(re.findall(r">=\s*(\d+\.\d+)", pyproject["project"]["requires-python"])),
                       "minimum Python in requires-python"),
        java=_single({a or b for a, b in re.findall(r"Java (\d+)|openjdk-(\d+)", makefile)},
                     "Java version in the Makefile"),
        version=pyproject["project"]["version"],
        makefile_pip=_makefile_pip(makefile),
        incr_env=frozenset(f.metadata["env"] for f in fields(Settings)),
        airflow_cli=airflow_cli,
        airflow_env=airflow_env,
        spark_classes=spark_classes,
        spark_text=spark_text,
        executables=frozenset(p.name for p in Path(sysconfig.get_path("scripts")).iterdir()),
    )


@pytest.fixture(scope="module")
def facts() -> Facts:
    """The facts, read once per module (Airflow's child process takes a few seconds)."""
    return read_facts()


# --- the deployment as text, and reading it ------------------------------------------------


@dataclass(frozen=True)
class Deployment:
    """The files under test, as text (a broken copy replaces one of them)."""

    compose_text: str
    dockerfiles: dict[str, str]  # path relative to the repository -> text
    env_example: str
    readme: str
    root: Path = REPO

    @property
    def compose(self) -> dict[str, Any]:
        return yaml.safe_load(self.compose_text)

    @property
    def services(self) -> dict[str, dict[str, Any]]:
        return self.compose.get("services") or {}

    def dockerfile(self, service: dict[str, Any]) -> str | None:
        """The Dockerfile text a service is built from (None: it runs a pulled image)."""
        build = service.get("build")
        if build is None:
            return None
        context, name = _build(build)
        return self.dockerfiles.get(str(PurePosixPath(context) / name).removeprefix("./"))


def read_deployment() -> Deployment:
    """docker-compose.yml, the Dockerfiles it builds, infra/.env.example and infra/README.md."""
    compose_text = COMPOSE.read_text()
    dockerfiles = {}
    for service in (yaml.safe_load(compose_text).get("services") or {}).values():
        if "build" in service:
            context, name = _build(service["build"])
            path = str(PurePosixPath(context) / name).removeprefix("./")
            if (REPO / path).is_file():
                dockerfiles[path] = (REPO / path).read_text()
    return Deployment(compose_text, dockerfiles, (INFRA / ".env.example").read_text(),
                      (INFRA / "README.md").read_text())


@pytest.fixture(scope="module")
def deployment() -> Deployment:
    return read_deployment()


def _build(build: str | dict[str, Any]) -> tuple[str, str]:
    """(context, dockerfile) of a ``build:`` entry."""
    if isinstance(build, str):
        return build, "Dockerfile"
    return build.get("context", "."), build.get("dockerfile", "Dockerfile")


def _argv(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def _commands(service: dict[str, Any]) -> Iterator[tuple[str, list[str]]]:
    """(where, argv) of the service's command, entrypoint and healthcheck."""
    for key in ("entrypoint", "command"):
        if service.get(key):
            yield key, _argv(service[key])
    test = (service.get("healthcheck") or {}).get("test")
    if isinstance(test, str):
        yield "healthcheck", shlex.split(test)
    elif test and test[0] == "CMD":
        yield "healthcheck", [str(t) for t in test[1:]]
    elif test and test[0] == "CMD-SHELL":
        yield "healthcheck", shlex.split(test[1])


def _command(service: dict[str, Any]) -> list[str]:
    return _argv(service.get("entrypoint")) + _argv(service.get("command"))


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.partition("=")[::2] for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


@dataclass(frozen=True)
class Mount:
    """One entry of a service's ``volumes``."""

    source: str
    target: str
    read_only: bool

    @property
    def bind(self) -> bool:
        return self.source.startswith((".", "/", "~"))


def _mounts(service: dict[str, Any]) -> list[Mount]:
    out = []
    for entry in service.get("volumes") or []:
        if isinstance(entry, dict):
            out.append(Mount(str(entry.get("source", "")), str(entry["target"]),
                             bool(entry.get("read_only"))))
        else:
            parts = str(entry).split(":")
            if len(parts) == 1:  # an anonymous volume
                out.append(Mount("", parts[0], False))
            else:
                out.append(Mount(parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")))
    return out


def _host_path(d: Deployment, service: dict[str, Any], path: str) -> Path | None:
    """The host path behind a container path, through the service's bind mounts (None: none)."""
    for m in sorted(_mounts(service), key=lambda m: -len(m.target)):
        if m.bind and (path == m.target or path.startswith(m.target.rstrip("/") + "/")):
            return d.root / m.source / os.path.relpath(path, m.target)
    return None


def _image_repo(image: str) -> tuple[str, str | None]:
    """(repository, tag) of an image reference (a digest counts as its tag)."""
    if "@" in image:
        repo, digest = image.split("@", 1)
        return repo.rsplit(":", 1)[0] if ":" in repo.rsplit("/", 1)[-1] else repo, digest
    last = image.rsplit("/", 1)[-1]
    if ":" in last:
        repo, tag = image.rsplit(":", 1)
        return repo, tag
    return image, None


def _interpolations(text: str) -> set[str]:
    """Variables compose substitutes: ``${VAR}``, ``${VAR:-default}``, ``$VAR`` (not ``$$``)."""
    names = set(re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)", text))
    return names | set(re.findall(r"(?<!\$)\$(?![{$])([A-Za-z_][A-Za-z0-9_]*)", text))


def _without_comments(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def _dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", _without_comments(text))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _dockerfile_env(text: str) -> dict[str, str]:
    env = {}
    for word, rest in _dockerfile_instructions(text):
        if word == "ENV":
            tokens = shlex.split(rest)
            if tokens and "=" not in tokens[0]:  # legacy ``ENV KEY value``
                env[tokens[0]] = " ".join(tokens[1:])
            else:
                env.update(t.partition("=")[::2] for t in tokens)
    return env


def _exec_form(rest: str) -> list[str]:
    return json.loads(rest) if rest.startswith("[") else shlex.split(rest)


def _runs_incr_or_executors(service: dict[str, Any]) -> bool:
    """Whether the service runs incr's code or Spark executors (and so needs the shared data)."""
    argv = _command(service)
    return bool(argv) and (argv[0] == "incr"
                           or (argv[0] == "airflow" and argv[1:2] and argv[1] in AIRFLOW_RUNS_INCR)
                           or (argv[0] == "spark-class" and argv[1:2] == [SPARK_WORKER]))


# --- the checks -------------------------------------------------------------------------------


def _expected_tag(repo: str, tag: str, f: Facts) -> str | None:
    """What is wrong with a known image's tag given the project's pins (None: nothing)."""
    name = repo.removeprefix("docker.io/").removeprefix("library/")
    rules = {
        "python": (f.python + ".", f"Python {f.python} (pyproject requires-python)"),
        "apache/airflow": (f.pins.get("apache-airflow", "?"), "apache-airflow in requirements.lock"),
        "apache/spark": (f.pins.get("pyspark", "?"), "pyspark in requirements.lock"),
        "eclipse-temurin": (f.java, f"Java {f.java} (Makefile)"),
    }
    if name not in rules:
        return None
    prefix, source = rules[name]
    if not tag.startswith(prefix):
        return f"tag {tag!r} does not match {source}: expected it to start with {prefix!r}"
    if name == "apache/airflow" and f"python{f.python}" not in tag:
        return f"tag {tag!r} does not name python{f.python}"
    return None


def _pinned(image: str, f: Facts) -> str | None:
    repo, tag = _image_repo(image)
    if tag is None or tag == "latest" or not (tag.startswith("sha256:") or re.match(r"\d+(\.\d+)+", tag)):
        return f"image {image!r} is not pinned to an exact version tag"
    if tag.startswith("sha256:"):
        return None
    return _expected_tag(repo, tag, f)


def check_images(d: Deployment, f: Facts) -> list[str]:
    """Every image is pinned to the project's versions, or built from a Dockerfile that exists."""
    problems = []
    for name, service in d.services.items():
        if "build" in service:
            context, dockerfile = _build(service["build"])
            if not (d.root / context).is_dir():
                problems.append(f"{name}: build context {context!r} does not exist")
            if d.dockerfile(service) is None:
                problems.append(f"{name}: Dockerfile {dockerfile!r} in {context!r} does not exist")
            image = service.get("image")
            if image and _image_repo(image)[1] != f.version:
                problems.append(f"{name}: built image {image!r} should be tagged with incr's "
                                f"version {f.version} (pyproject.toml)")
        elif not service.get("image"):
            problems.append(f"{name}: neither image nor build")
        elif problem := _pinned(service["image"], f):
            problems.append(f"{name}: {problem}")
    for path, text in d.dockerfiles.items():
        for word, rest in _dockerfile_instructions(text):
            if word == "FROM":
                image = next(t for t in rest.split() if not t.startswith("--"))
                if problem := _pinned(image, f):
                    problems.append(f"{path}: FROM {problem}")
    return problems


def _dockerignore_allows(ignore: str | None, source: str) -> bool:
    """Whether an allow-list .dockerignore (``*`` then ``!path`` lines) lets ``source`` through."""
    if ignore is None:
        return True
    lines = [ln.strip() for ln in _without_comments(ignore).splitlines() if ln.strip()]
    if "*" not in lines:
        return not any(source == ln or source.startswith(ln.rstrip("/") + "/") for ln in lines)
    source = source.rstrip("/")
    return any(source == ln[1:].rstrip("/") or source.startswith(ln[1:].rstrip("/") + "/")
               for ln in lines if ln.startswith("!"))


def check_dockerfiles(d: Deployment, f: Facts) -> list[str]:
    """Dockerfiles install Java and incr as the Makefile does, and copy files that exist."""
    problems = []
    builds = {}
    for service in d.services.values():
        if d.dockerfile(service) is not None:
            context, dockerfile = _build(service["build"])
            builds[str(PurePosixPath(context) / dockerfile).removeprefix("./")] = context
    for path, context in builds.items():
        text = d.dockerfiles[path]
        ignore_file = d.root / (path + ".dockerignore")
        if not ignore_file.is_file():
            ignore_file = d.root / context / ".dockerignore"
        ignore = ignore_file.read_text() if ignore_file.is_file() else None
        instructions = _dockerfile_instructions(text)
        javas = set(re.findall(r"openjdk-(\d+)-j(?:re|dk)", text))
        if javas != {f.java}:
            problems.append(f"{path}: installs Java {sorted(javas)}, the Makefile requires {f.java}")
        installs = [shlex.split(m.group(1).split("&&")[0])
                    for word, rest in instructions if word == "RUN"
                    for m in re.finditer(r"-m pip install ([^&;]+)", rest)]
        for args in f.makefile_pip:
            if args not in installs:
                problems.append(f"{path}: does not run the Makefile's `pip install {shlex.join(args)}`")
        for args in installs:
            for i, arg in enumerate(args):
                if arg == "-r" and args[i + 1:] and args[i + 1] != "requirements.lock":
                    if (d.root / context / args[i + 1]).is_file():
                        problems += _requirements_pins(d.root / context / args[i + 1], f)
                    else:
                        problems.append(f"{path}: installs {args[i + 1]}, not a file of the repository")
        for word, rest in instructions:
            if word not in ("COPY", "ADD"):
                continue
            tokens = _exec_form(rest)
            if any(t.startswith("--from") for t in tokens):
                continue
            for source in [t for t in tokens if not t.startswith("--")][:-1]:
                if not (d.root / context / source).exists():
                    problems.append(f"{path}: {word} source {source!r} does not exist")
                elif not _dockerignore_allows(ignore, source):
                    problems.append(f"{path}: {word} source {source!r} is excluded by {ignore_file.name}")
    return problems


def _requirements_pins(path: Path, f: Facts) -> list[str]:
    """An extra requirements file pins exactly, and agrees with requirements.lock."""
    problems = []
    for line in _without_comments(path.read_text()).splitlines():
        if not line.strip():
            continue
        name, sep, version = line.partition("==")
        if not sep:
            problems.append(f"{path.name}: {line.strip()!r} is not pinned with ==")
        elif f.pins.get(name.strip().lower(), version.strip()) != version.strip():
            problems.append(f"{path.name}: {line.strip()} disagrees with requirements.lock "
                            f"({f.pins[name.strip().lower()]})")
    return problems


def _airflow_problem(argv: list[str], f: Facts) -> str | None:
    """What Airflow's CLI would refuse in ``airflow <argv>`` (subcommands and option names)."""
    node, path = f.airflow_cli, ["airflow"]
    rest = list(argv)
    while node["commands"]:
        if not rest or rest[0] not in node["commands"]:
            got = rest[0] if rest else "nothing"
            return f"`{' '.join(path)}` takes one of {sorted(node['commands'])}, not {got!r}"
        path.append(rest[0])
        node = node["commands"][rest.pop(0)]
    for token in rest:
        if token.startswith("-") and token.split("=")[0] not in node["options"]:
            return f"`{' '.join(path)}` has no option {token.split('=')[0]!r}"
    return None


def _incr_problem(argv: list[str]) -> str | None:
    """What incr's own parser (incr.cli) says about ``incr <argv>`` (None: it parses)."""
    from incr.cli import _parser

    parser: argparse.ArgumentParser = _parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as e:
        if e.code:
            return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "refused"
    return None


def _argv_problem(argv: list[str], image: str | None, f: Facts) -> str | None:
    """What is wrong with a command run in the built image (image None) or a pulled one."""
    if not argv:
        return "empty command"
    exe = argv[0]
    if image is not None:
        known = EXTERNAL_EXECUTABLES.get(_image_repo(image)[0], set())
        return None if exe in known else f"{exe!r} is not a known executable of image {image!r}"
    if exe not in f.executables:
        return f"{exe!r} is not installed by requirements.lock / incr"
    if exe == "airflow":
        return _airflow_problem(argv[1:], f)
    if exe == "incr":
        return _incr_problem(argv[1:])
    if exe == "spark-class":
        return _spark_class_problem(argv[1:], f)
    return None


def _spark_class_problem(argv: list[str], f: Facts) -> str | None:
    """What is wrong with ``spark-class <class> [args]`` (None: nothing).

    The class must be in pyspark's jars; the options of a deploy daemon (Master, Worker), which
    its ``<class>Arguments`` class parses, must occur in that class.
    """
    if not argv or argv[0] not in f.spark_classes:
        return f"spark-class: {argv[:1]} is not a class of pyspark's jars"
    arguments = argv[0] + "Arguments"
    if arguments in f.spark_classes:
        with zipfile.ZipFile(f.spark_classes[arguments]) as z:
            text = z.read(arguments.replace(".", "/") + ".class")
        for token in argv[1:]:
            if token.startswith("--") and token.encode() not in text:
                return f"spark-class {argv[0]} has no option {token!r}"
    return None


def check_commands(d: Deployment, f: Facts) -> list[str]:
    """Every command, entrypoint and healthcheck runs a real executable with real arguments."""
    problems = []
    for name, service in d.services.items():
        image = None if "build" in service else service.get("image")
        for where, argv in _commands(service):
            if problem := _argv_problem(argv, image, f):
                problems.append(f"{name} {where}: {problem}")
    for path, text in d.dockerfiles.items():
        for word, rest in _dockerfile_instructions(text):
            if word in ("CMD", "ENTRYPOINT") and (problem := _argv_problem(_exec_form(rest), None, f)):
                problems.append(f"{path} {word}: {problem}")
    return problems


def check_paths(d: Deployment, f: Facts) -> list[str]:
    """Bind mounts and program files exist; dags/ and sql/ are mounted read-only, side by side."""
    problems = []
    declared = set(d.compose.get("volumes") or {})
    for name, service in d.services.items():
        mounts = _mounts(service)
        for m in mounts:
            if m.bind:
                if not m.source.startswith("."):
                    problems.append(f"{name}: bind mount {m.source!r} is not a path in the repository")
                elif not (d.root / m.source).exists():
                    problems.append(f"{name}: bind-mounted {m.source!r} does not exist")
                elif PurePosixPath(m.source).name in ("dags", "sql") and not m.read_only:
                    problems.append(f"{name}: {m.source} is not mounted read-only")
            elif m.source and m.source not in declared:
                problems.append(f"{name}: volume {m.source!r} is not declared under volumes:")
        dags = _environment(service).get("AIRFLOW__CORE__DAGS_FOLDER")
        targets = {PurePosixPath(m.source).name: m.target for m in mounts if m.bind}
        if "dags" in targets:
            if dags and targets["dags"] != dags:
                problems.append(f"{name}: dags/ is mounted at {targets['dags']}, DAGS_FOLDER is {dags}")
            # dags/incr_programs.py reads the programs beside its own folder.
            want = str(PurePosixPath(targets["dags"]).parent / "sql")
            if targets.get("sql") != want:
                problems.append(f"{name}: sql/ must be mounted at {want} (beside the DAGs folder)")
        argv = _command(service)
        if argv[:1] == ["incr"]:
            for arg in argv[2:]:
                if arg.endswith(".sql"):
                    host = _host_path(d, service, arg)
                    if host is None or not host.is_file():
                        problems.append(f"{name}: program {arg} is not a file of the repository "
                                        "behind a bind mount")
    return problems


def check_variables(d: Deployment, f: Facts) -> list[str]:
    """Every variable and Spark setting named is one its component reads."""
    problems = []

    def spark_known(name: str) -> bool:
        return name.encode() in f.spark_text

    def check(where: str, env: dict[str, str], image: str | None) -> None:
        for key, value in env.items():
            if key.startswith("INCR_"):
                ok = key in f.incr_env
            elif key.startswith("AIRFLOW__"):
                ok = key in f.airflow_env
            elif key.startswith(("SPARK_", "PYSPARK_")):
                ok = spark_known(key)
            elif image is not None:
                ok = key in EXTERNAL_VARIABLES.get(_image_repo(image)[0], set())
            else:
                ok = key in IMAGE_VARIABLES
            if not ok:
                problems.append(f"{where}: {key} is not a variable its component reads")
            if key == "INCR_SPARK_CONF":
                for item in filter(None, value.split(",")):
                    if not spark_known(item.partition("=")[0].strip()):
                        problems.append(f"{where}: INCR_SPARK_CONF sets {item.partition('=')[0]!r}, "
                                        "not a Spark setting")

    for name, service in d.services.items():
        check(name, _environment(service), None if "build" in service else service.get("image"))
    for path, text in d.dockerfiles.items():
        check(path, _dockerfile_env(text), None)
    for conf in sorted(d.root.glob("infra/*.conf")):
        for line in _without_comments(conf.read_text()).splitlines():
            if line.strip() and not spark_known(line.split()[0]):
                problems.append(f"{conf.name}: {line.split()[0]!r} is not a Spark setting")
    documented = set(re.findall(r"^\s*#?\s*([A-Za-z_][A-Za-z0-9_]*)=", d.env_example, re.MULTILINE))
    for var in sorted(_interpolations(_without_comments(d.compose_text)) - documented):
        problems.append(f"docker-compose.yml interpolates ${{{var}}}, not documented in infra/.env.example")
    return problems


def check_wiring(d: Deployment, f: Facts) -> list[str]:
    """depends_on, ports on 127.0.0.1, scalable workers, one image and one data volume."""
    problems = []
    services = d.services
    for name, service in services.items():
        depends = service.get("depends_on") or {}
        for other, spec in (depends.items() if isinstance(depends, dict) else ((o, {}) for o in depends)):
            condition = (spec or {}).get("condition", "service_started")
            if other not in services:
                problems.append(f"{name}: depends on {other!r}, which is not a service")
            elif condition not in DEPENDS_CONDITIONS:
                problems.append(f"{name}: depends on {other} with unknown condition {condition!r}")
            elif condition == "service_healthy" and not services[other].get("healthcheck"):
                problems.append(f"{name}: waits for {other} to be healthy, which has no healthcheck")
            elif condition == "service_completed_successfully" and services[other].get("restart") != "no":
                problems.append(f"{name}: waits for {other} to complete, which restarts")
        for port in service.get("ports") or []:
            host_ip = port.get("host_ip") if isinstance(port, dict) else str(port).split(":")[0]
            if host_ip != "127.0.0.1" or (isinstance(port, str) and port.count(":") < 2):
                problems.append(f"{name}: port {port} is not published on 127.0.0.1 only")
        if _command(service)[:2] == ["spark-class", SPARK_WORKER] and (
                service.get("container_name") or service.get("ports")):
            problems.append(f"{name}: a Spark worker with a fixed name or host port cannot be scaled")
    sharing = {n: s for n, s in services.items() if _runs_incr_or_executors(s)}
    if not sharing:
        return [*problems, "no service runs incr or Spark executors"]
    for key in ("INCR_LANDING", "INCR_WAREHOUSE"):
        values = {n: _environment(s).get(key) for n, s in sharing.items()}
        if None in values.values() or len(set(values.values())) != 1:
            problems.append(f"{key} differs between the services that run incr or Spark: {values}")
    warehouse = _environment(next(iter(sharing.values()))).get("INCR_WAREHOUSE") or "?"
    shared = {}
    images = {}
    for name, service in sharing.items():
        holding = [m for m in _mounts(service)
                   if warehouse == m.target or warehouse.startswith(m.target.rstrip("/") + "/")]
        shared[name] = (holding[0].source, holding[0].target) if holding else None
        images[name] = (service.get("image"), json.dumps(service.get("build"), sort_keys=True))
        argv = _command(service)
        for flag in ("--warehouse", "--landing"):
            if argv[:1] == ["incr"] and flag in argv:
                value = argv[argv.index(flag) + 1]
                expected = _environment(service).get("INCR_" + flag[2:].upper())
                if value != expected:
                    problems.append(f"{name}: {flag} {value} is not INCR_{flag[2:].upper()} ({expected})")
    if None in shared.values() or len(set(shared.values())) != 1:
        problems.append(f"the warehouse {warehouse} is not on one volume mounted at one path in every "
                        f"service that runs incr or Spark: {shared}")
    if len(set(images.values())) != 1:
        problems.append(f"the services that run incr or Spark do not run one image: {images}")
    return problems


def check_services(d: Deployment, f: Facts) -> list[str]:
    """The services the deployment promises exist: Airflow on PostgreSQL, Spark, the BI endpoint."""
    problems = []
    commands = {n: _command(s) for n, s in d.services.items()}
    wanted = {
        "airflow db migrate": lambda a: a[:3] == ["airflow", "db", "migrate"],
        "airflow api-server": lambda a: a[:2] == ["airflow", "api-server"],
        "airflow scheduler": lambda a: a[:2] == ["airflow", "scheduler"],
        "airflow dag-processor": lambda a: a[:2] == ["airflow", "dag-processor"],
        "airflow triggerer": lambda a: a[:2] == ["airflow", "triggerer"],
        "Spark master": lambda a: a[:2] == ["spark-class", SPARK_MASTER],
        "Spark worker": lambda a: a[:2] == ["spark-class", SPARK_WORKER],
        "incr serve": lambda a: a[:2] == ["incr", "serve"],
    }
    for what, runs in wanted.items():
        if not any(runs(a) for a in commands.values()):
            problems.append(f"no service runs {what}")
    postgres = [n for n, s in d.services.items() if _image_repo(s.get("image") or "")[0] == "postgres"]
    if not postgres:
        problems.append("no PostgreSQL service")
    airflow = {n: _environment(s) for n, s in d.services.items() if commands[n][:1] == ["airflow"]}
    for key in ("AIRFLOW__CORE__EXECUTOR", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
                "AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW__CORE__FERNET_KEY", "AIRFLOW__API_AUTH__JWT_SECRET"):
        values = {env.get(key) for env in airflow.values()}
        if len(values) != 1 or None in values:
            problems.append(f"the Airflow services do not agree on {key}")
    for name, env in airflow.items():
        if env.get("AIRFLOW__CORE__EXECUTOR") != "LocalExecutor":
            problems.append(f"{name}: executor is not LocalExecutor")
        conn = env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "")
        host = re.match(r"postgresql(\+\w+)?://[^@]*@([^:/]+)", conn)
        if not host or host.group(2) not in postgres:
            problems.append(f"{name}: the metadata DB is not the PostgreSQL service")
    for name in d.services:
        if not re.search(rf"\b{re.escape(name)}\b", d.readme):
            problems.append(f"infra/README.md does not describe the service {name}")
    return problems


CHECKS: list[Callable[[Deployment, Facts], list[str]]] = [
    check_images, check_dockerfiles, check_commands, check_paths, check_variables, check_wiring,
    check_services,
]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_deployment(check: Callable[[Deployment, Facts], list[str]], deployment: Deployment, facts: Facts):
    assert check(deployment, facts) == []


# --- each check can fail -------------------------------------------------------------------------

_DOCKERFILE = "infra/Dockerfile"

#: (what breaks, file, text, replacement, check, words of the expected problem)
BROKEN = [
    ("unpinned image", "compose", "postgres:17.6-bookworm", "postgres:latest", check_images, "not pinned"),
    ("other Python", _DOCKERFILE, "python:3.11.14-slim", "python:3.12.7-slim", check_images,
     "requires-python"),
    ("built image tag", "compose", "image: incr:0.1.0", "image: incr:latest", check_images, "incr's version"),
    ("missing Dockerfile", "compose", "dockerfile: infra/Dockerfile", "dockerfile: infra/Dockerfil",
     check_images, "does not exist"),
    ("other Java", _DOCKERFILE, "openjdk-17-jdk", "openjdk-21-jdk", check_dockerfiles, "Makefile requires"),
    ("not the Makefile's install", _DOCKERFILE, "--no-deps -e .", "-e .", check_dockerfiles,
     "--no-deps -e .`"),
    ("missing COPY source", _DOCKERFILE, "COPY incr/ incr/", "COPY incr2/ incr/", check_dockerfiles,
     "'incr2/' does not exist"),
    ("airflow subcommand", "compose", '"airflow", "dag-processor"', '"airflow", "dag-processer"',
     check_commands, "not 'dag-processer'"),
    ("airflow option", "compose", '"--job-type", "TriggererJob"', '"--jobtype", "TriggererJob"',
     check_commands, "no option '--jobtype'"),
    ("incr subcommand", "compose", '"incr", "serve"', '"incr", "serv"', check_commands, "invalid choice"),
    ("incr option", "compose", '"--warehouse", "/data/warehouse"', '"--warehous-dir", "/data/warehouse"',
     check_commands, "unrecognized arguments"),
    ("spark class", "compose", "deploy.worker.Worker", "deploy.worker.Workr", check_commands,
     "not a class of pyspark"),
    ("spark option", "compose", '"--webui-port", "8081"', '"--web-ui-port", "8081"', check_commands,
     "no option '--web-ui-port'"),
    ("executable", "compose", '["CMD", "pg_isready"', '["CMD", "pg_ready"', check_commands,
     "not a known executable"),
    ("bind mount", "compose", "./sql:/opt/incr/sql:ro", "./sqls:/opt/incr/sql:ro", check_paths,
     "'./sqls' does not exist"),
    ("dags writable", "compose", "./dags:/opt/incr/dags:ro", "./dags:/opt/incr/dags", check_paths,
     "not mounted read-only"),
    ("program file", "compose", "examples/sales.sql", "examples/sale.sql", check_paths, "is not a file"),
    ("sql beside dags", "compose", "./sql:/opt/incr/sql:ro", "./sql:/opt/sql:ro", check_paths,
     "beside the DAGs folder"),
    ("incr variable", "compose", "INCR_SPARK_MASTER: local[2]", "INCR_SPARK_MASTR: local[2]",
     check_variables, "INCR_SPARK_MASTR is not"),
    ("airflow variable", "compose", "AIRFLOW__CORE__LOAD_EXAMPLES", "AIRFLOW__CORE__LOAD_EXAMPLE",
     check_variables, "AIRFLOW__CORE__LOAD_EXAMPLE is not"),
    ("spark variable", "compose", "SPARK_WORKER_DIR:", "SPARK_WORKERS_DIR:", check_variables,
     "SPARK_WORKERS_DIR is not"),
    ("spark setting", "compose", "spark.driver.bindAddress", "spark.driver.bindAdress", check_variables,
     "not a Spark setting"),
    ("undocumented interpolation", "compose", "${SPARK_WORKER_CORES:-2}", "${SPARK_CORES:-2}",
     check_variables, "${SPARK_CORES}"),
    ("unknown dependency", "compose", "      airflow-init:\n        condition",
     "      airflow-initialise:\n        condition", check_wiring, "not a service"),
    ("healthy without healthcheck", "compose", "      spark-master:\n        condition: service_healthy",
     "      spark-worker:\n        condition: service_healthy", check_wiring, "no healthcheck"),
    ("port on every interface", "compose", '"127.0.0.1:10000:10000"', '"10000:10000"', check_wiring,
     "127.0.0.1 only"),
    ("data elsewhere", "compose", "      - incr-data:/data\n    depends_on:\n      spark-master",
     "      - incr-data:/mnt/data\n    depends_on:\n      spark-master", check_wiring,
     "not on one volume"),
    ("warehouse elsewhere", "compose", '"--warehouse", "/data/warehouse"', '"--warehouse", "/tmp/w"',
     check_wiring, "--warehouse /tmp/w"),
    ("another image for the BI endpoint", "compose", "  incr-bi:\n    <<: *incr-image\n",
     "  incr-bi:\n    image: apache/spark:4.0.1-python3\n", check_wiring, "do not run one image"),
    ("other Spark", "compose", "  incr-bi:\n    <<: *incr-image\n",
     "  incr-bi:\n    image: apache/spark:3.5.1-python3\n", check_images, "pyspark in requirements.lock"),
    ("other executor", "compose", "EXECUTOR: LocalExecutor", "EXECUTOR: CeleryExecutor", check_services,
     "not LocalExecutor"),
    ("no triggerer", "compose", '"airflow", "triggerer"', '"airflow", "scheduler"', check_services,
     "no service runs airflow triggerer"),
]


@pytest.mark.parametrize(("file", "old", "new", "check", "expected"), [b[1:] for b in BROKEN],
                         ids=[b[0] for b in BROKEN])
def test_broken(file: str, old: str, new: str, check: Callable[[Deployment, Facts], list[str]],
                expected: str, deployment: Deployment, facts: Facts):
    """The check finds the deliberate mistake (and the text it replaces is really there)."""
    if file == "compose":
        assert old in deployment.compose_text, old
        broken = replace(deployment, compose_text=deployment.compose_text.replace(old, new))
    else:
        assert old in deployment.dockerfiles[file], old
        broken = replace(deployment, dockerfiles={**deployment.dockerfiles,
                                                  file: deployment.dockerfiles[file].replace(old, new)})
    problems = check(broken, facts)
    assert any(expected in p for p in problems), problems


def test_dockerignore_allow_list():
    ignore = "*\n!incr\n!infra/spark-defaults.conf\n**/__pycache__\n"
    assert _dockerignore_allows(ignore, "incr/")
    assert _dockerignore_allows(ignore, "incr/runtime/session.py")
    assert _dockerignore_allows(ignore, "infra/spark-defaults.conf")
    assert not _dockerignore_allows(ignore, "infra/Dockerfile")
    assert not _dockerignore_allows(ignore, "incr2")
    assert _dockerignore_allows(None, "anything")


def test_extra_requirements_agree_with_the_lock(tmp_path: Path, facts: Facts):
    extra = tmp_path / "requirements-extra.txt"
    extra.write_text(f"# a comment\npyspark=={facts.pins['pyspark']}\nasyncpg==0.32.0\n")
    assert _requirements_pins(extra, facts) == []
    extra.write_text("pyspark==3.5.1\nasyncpg>=0.30\n")
    problems = _requirements_pins(extra, facts)
    assert any("disagrees with requirements.lock" in p for p in problems), problems
    assert any("not pinned" in p for p in problems), problems
