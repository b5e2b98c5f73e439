"""The two images, built with podman from Debian's packages alone (``make images``).

No registry is needed: the base is a Debian root made by ``mmdebstrap`` from Debian's packages
(``python3`` and ``python3-venv`` on ``minbase``), kept outside the repository in
``~/.cache/shoal/images/<release>-python<version>-<recipe>/`` (``SHOAL_IMAGES_CACHE`` moves it)
and turned into the image ``localhost/shoal-base:<that key>`` with a ``FROM scratch`` build. Both
Dockerfiles then build on it (``--build-arg BASE=...``, ``--pull=never``), their Python
dependencies pinned with hashes in ``requirements/images.lock`` (the build tools in
``requirements/build.lock``; the project's own distributions, the product and the worker library
in ``worker/``, are built from the checkout, never fetched), and each image is saved as an OCI
archive in ``build/``: ``build/shoal-scheduler.oci.tar`` and ``build/shoal-agent.oci.tar``. A
second run reuses the cached base and podman's layer cache, and saves an archive again only when
its image changed.

Every file in a layer carries the same fixed time (``--timestamp``) and every ``.pyc`` is
hash-based, so the images depend only on their inputs: the same sources, lock and base give the
same image digest, and the same archive byte for byte. ``lock`` regenerates both lock files
with ``uv pip compile`` (installed from PyPI into the cache on first use);
``tests/unit/test_image_lock.py`` fails when they drift from ``pyproject.toml``.

What this machine kind needs from podman, each found the hard way: ``runc`` where cgroups are
hybrid (``crun`` refuses them), the ``cgroupfs`` manager and a file event log without systemd,
ulimits no higher than this process may set; all go into a ``containers.conf`` in the cache that
every podman call here reads (``CONTAINERS_CONF``). pip inside the build reaches the package
index with this machine's CA bundle mounted into the build; nothing of it stays in an image.

Run ``python3 -m devcluster.images`` (standard library only: the build needs no virtualenv).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import resource
import shutil
import subprocess
import sys
import tarfile
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from devcluster.errors import DevclusterError

Say = Callable[[str], None]

ROOT: Final = Path(__file__).resolve().parents[1]
OUT_DIR: Final = ROOT / "build"
LOCK: Final = ROOT / "requirements" / "images.lock"
BUILD_LOCK: Final = ROOT / "requirements" / "build.lock"
LOCK_COMMAND: Final = "python3 -m devcluster.images lock"
#: The project's distributions besides the product's, built from the checkout into the images
#: (never fetched from an index, so never in the lock): the worker library, which carries the
#: socket protocol the agent serves.
LOCAL_DISTRIBUTIONS: Final[Mapping[str, Path]] = {"shoal-worker": ROOT / "worker"}

#: Where the base root and the tools live; outside the repository, kept between builds.
CACHE_ENV: Final = "SHOAL_IMAGES_CACHE"
#: Debian's release and the Python it ships (the base image's key says both).
DEBIAN_RELEASE: Final = "bookworm"
PYTHON: Final = "3.11"
BASE_PACKAGES: Final = ("python3", "python3-venv")
DEBIAN_SOURCES: Final = (
    f"deb http://deb.debian.org/debian {DEBIAN_RELEASE} main",
    f"deb http://deb.debian.org/debian {DEBIAN_RELEASE}-updates main",
    f"deb http://deb.debian.org/debian-security {DEBIAN_RELEASE}-security main",
)
#: The time every file and history entry of the images carries (2025-01-01T00:00:00Z).
SOURCE_DATE_EPOCH: Final = 1735689600
#: uv, from PyPI, writes the lock files.
UV_VERSION: Final = "0.13.8"
#: The commands ``build`` runs and the Debian packages that bring them.
TOOLS: Final[Mapping[str, str]] = {
    "podman": "podman",
    "runc": "runc",
    "mmdebstrap": "mmdebstrap",
}
#: Left out of the build context: what Python writes beside the sources.
CACHE_FILES: Final = ("__pycache__", "*.pyc")
#: podman's default process limit is above what an unprivileged container may get here.
MAX_NPROC: Final = 32768


class ImagesError(DevclusterError):
    """A tool is missing or a build step failed; the message says which and what to do."""


@dataclass(frozen=True, slots=True)
class Image:
    """One of the two programs' images."""

    name: str
    dockerfile: str

    def tag(self, version: str) -> str:
        return f"localhost/shoal-{self.name}:{version}"

    @property
    def archive(self) -> Path:
        return OUT_DIR / f"shoal-{self.name}.oci.tar"


IMAGES: Final = (Image("scheduler", "Dockerfile.scheduler"), Image("agent", "Dockerfile.agent"))


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "shoal" / "images"


def project_version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


# --- the base ------------------------------------------------------------------------------


def mmdebstrap_args(target: Path) -> list[str]:
    """The command that writes the base root as a tar to ``target``."""
    excluded = ("man", "locale", "info", "doc")
    dpkg = [f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in excluded]
    return [
        "mmdebstrap",
        "--variant=minbase",
        "--format=tar",
        "--mode=root",
        f"--include={','.join(BASE_PACKAGES)}",
        "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
        *dpkg,
        # Licences stay (Debian's copyright files).
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        '--aptopt=Acquire::Languages "none"',
        # The container runtime provides /dev.
        "--skip=output/dev",
        DEBIAN_RELEASE,
        str(target),
        *DEBIAN_SOURCES,
    ]


BASE_CONTAINERFILE: Final = """\
FROM scratch
ADD rootfs.tar /
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
CMD ["python3"]
"""


def base_key() -> str:
    """``<release>-python<version>-<recipe>``: a new recipe gets a new base, the old one stays."""
    recipe = "\n".join([*mmdebstrap_args(Path("-")), BASE_CONTAINERFILE, str(SOURCE_DATE_EPOCH)])
    return f"{DEBIAN_RELEASE}-python{PYTHON}-{hashlib.sha256(recipe.encode()).hexdigest()[:10]}"


def base_tag() -> str:
    return f"localhost/shoal-base:{base_key()}"


def ensure_base(podman: Podman, *, say: Say, refresh: bool = False) -> str:
    """The base image's tag; its root is made from Debian's packages when not cached."""
    folder = cache_root() / base_key()
    rootfs = folder / "rootfs.tar"
    if refresh and rootfs.exists():
        rootfs.unlink()
    if not rootfs.exists():
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / "rootfs.tar.partial"
        say(f"images: making the base root from Debian's packages into {folder} (a minute or two)")
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)}
        _run(mmdebstrap_args(partial), env=env, what="mmdebstrap (the base root)")
        partial.replace(rootfs)
    (folder / "Containerfile").write_text(BASE_CONTAINERFILE)
    tag = base_tag()
    if refresh or not podman.has_image(tag):
        say(f"images: {tag} from {rootfs}")
        podman.build(["-f", str(folder / "Containerfile"), "-t", tag, str(folder)])
    return tag


# --- podman --------------------------------------------------------------------------------


def containers_conf(*, hybrid_cgroups: bool, systemd: bool, nofile: int, nproc: int) -> str:
    """podman's settings for this machine (see the module docstring for why each is here)."""
    engine = ['events_logger = "file"']
    if hybrid_cgroups:
        engine.append('runtime = "runc"')
    if not systemd:
        engine.append('cgroup_manager = "cgroupfs"')
    ulimits = f'"nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"'
    return "\n".join(
        ["[containers]", f"default_ulimits = [{ulimits}]", "", "[engine]", *engine, ""]
    )


def _hard_limit(which: int, ceiling: int) -> int:
    hard = resource.getrlimit(which)[1]
    return ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)


def podman_env() -> dict[str, str]:
    """The environment every podman call here runs with (writes the ``containers.conf``)."""
    conf = cache_root() / "containers.conf"
    text = containers_conf(
        hybrid_cgroups=not Path("/sys/fs/cgroup/cgroup.controllers").exists(),
        systemd=Path("/run/systemd/system").is_dir(),
        nofile=_hard_limit(resource.RLIMIT_NOFILE, 1 << 20),
        nproc=_hard_limit(resource.RLIMIT_NPROC, MAX_NPROC),
    )
    if not conf.exists() or conf.read_text() != text:
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(text)
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


@dataclass(frozen=True, slots=True)
class Podman:
    """podman with this machine's settings and the mounts that let pip in a build reach PyPI."""

    env: Mapping[str, str]
    mounts: Sequence[str] = ()

    def run(self, args: Sequence[str], *, what: str) -> str:
        return _run(["podman", *args], env=self.env, what=what, capture=True)

    def has_image(self, ref: str) -> bool:
        exists = subprocess.run(["podman", "image", "exists", ref], env=self.env, check=False)
        return exists.returncode == 0

    def image_id(self, ref: str) -> str:
        return self.run(["image", "inspect", "--format", "{{.Id}}", ref], what="inspect").strip()

    def build(self, args: Sequence[str]) -> None:
        command = [
            "podman",
            "build",
            "--pull=never",
            "--layers",
            f"--timestamp={SOURCE_DATE_EPOCH}",
            *(f"--volume={m}" for m in self.mounts),
            *args,
        ]
        _run(command, env=self.env, what="podman build")


def build_mounts(cache: Path) -> list[str]:
    """This machine's CA bundle and a pip.conf naming it, read-only, for pip inside builds."""
    bundle = Path(os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt")
    if not bundle.is_file():
        return []
    inside = "/etc/ssl/certs/ca-certificates.crt"
    pip_conf = cache / "pip.conf"
    pip_conf.write_text(f"[global]\ncert = {inside}\n")
    return [f"{bundle.resolve()}:{inside}:ro", f"{pip_conf}:/etc/pip.conf:ro"]


# --- the tools -----------------------------------------------------------------------------


def missing_packages() -> list[str]:
    return sorted({package for command, package in TOOLS.items() if not shutil.which(command)})


def ensure_tools(*, say: Say) -> None:
    """Install the Debian packages ``build`` needs when they are missing (as root, with apt)."""
    missing = missing_packages()
    if not missing:
        return
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing]
    if not shutil.which("apt-get") or os.geteuid() != 0:
        raise ImagesError(
            f"missing {', '.join(missing)}: install them (Debian: `{' '.join(install)}` as root)"
        )
    say(f"images: installing Debian's {', '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(install, env=env, check=False).returncode != 0:
        # The package lists may be missing or stale on a fresh machine: read them once.
        _run(["apt-get", "update", "-qq"], env=env, what="apt-get update")
        _run(install, env=env, what="apt-get install")
    still = missing_packages()
    if still:
        raise ImagesError(f"installed {', '.join(missing)} but {', '.join(still)} still missing")


def _run(
    command: Sequence[str], *, env: Mapping[str, str], what: str, capture: bool = False
) -> str:
    result = subprocess.run(
        command, env=env, cwd=ROOT, check=False, text=True, capture_output=capture
    )
    if result.returncode != 0:
        detail = (result.stderr or "").strip()[-2000:] if capture else "(output above)"
        raise ImagesError(f"{what} failed (exit {result.returncode}): {detail}")
    return result.stdout or ""


# --- build and save ------------------------------------------------------------------------


def save(podman: Podman, image: Image, tag: str, *, say: Say) -> bool:
    """Write the image's OCI archive unless the one there already holds it; True if written."""
    image_id = podman.image_id(tag)
    stamp = image.archive.with_name(f".{image.archive.name}.id")
    if image.archive.exists() and stamp.exists() and stamp.read_text() == image_id:
        say(f"images: {image.archive.relative_to(ROOT)} is up to date")
        return False
    image.archive.parent.mkdir(parents=True, exist_ok=True)
    saved = image.archive.with_name(image.archive.name + ".saved")
    partial = image.archive.with_name(image.archive.name + ".partial")
    saved.unlink(missing_ok=True)
    podman.run(["save", "--format", "oci-archive", "-o", str(saved), tag], what="podman save")
    normalize_archive(saved, partial)
    saved.unlink()
    partial.replace(image.archive)
    stamp.write_text(image_id)
    size = image.archive.stat().st_size / 1e6
    say(f"images: {image.archive.relative_to(ROOT)} ({size:.0f} MB) holds {tag}")
    return True


def normalize_archive(source: Path, target: Path) -> None:
    """Copy a tar with its entries sorted and their times and owners fixed.

    podman writes each entry of an OCI archive with the time of saving; the same image then
    gives the same archive, byte for byte.
    """
    with tarfile.open(source) as src, tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as dst:
        for member in sorted(src.getmembers(), key=lambda m: m.name):
            member.mtime = SOURCE_DATE_EPOCH
            member.uid = member.gid = 0
            member.uname = member.gname = ""
            member.pax_headers = {}
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)


def stage_context(target: Path) -> Path:
    """The build context: what ``.dockerignore`` lets in, copied with one fixed time.

    podman's layer cache keys a ``COPY`` on its files' times too; with fixed times a fresh
    checkout (or a file touched and restored) reuses the cached layers, and a build is not
    disturbed by edits made while it runs.
    """
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    keep = [line[1:].strip("/") for line in ignore if line.startswith("!")]
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for name in keep:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns(*CACHE_FILES))
        elif source.is_file():
            shutil.copyfile(source, target / name)
    for path in [target, *target.rglob("*")]:
        os.utime(path, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH), follow_symlinks=False)
    return target


def build(*, say: Say = _say, refresh_base: bool = False) -> list[Path]:
    """Both images, saved as OCI archives; returns their paths."""
    if os.geteuid() != 0:
        raise ImagesError(
            "building the images needs root (mmdebstrap makes the base root as root and podman "
            "keeps the layers in root's storage): run `sudo make images`"
        )
    ensure_tools(say=say)
    cache = cache_root()
    cache.mkdir(parents=True, exist_ok=True)
    podman = Podman(env=podman_env(), mounts=build_mounts(cache))
    base = ensure_base(podman, say=say, refresh=refresh_base)
    version = project_version()
    context = stage_context(OUT_DIR / "context")
    for image in IMAGES:
        tag = image.tag(version)
        say(f"images: building {tag} ({image.dockerfile} on {base})")
        dockerfile = str(ROOT / image.dockerfile)
        podman.build(["--build-arg", f"BASE={base}", "-f", dockerfile, "-t", tag, str(context)])
        save(podman, image, tag, say=say)
    return [image.archive for image in IMAGES]


# --- the lock files ------------------------------------------------------------------------


def uv(*, say: Say) -> Path:
    """uv from PyPI in a virtualenv of its own in the cache."""
    venv = cache_root() / "tools" / f"uv-{UV_VERSION}"
    binary = venv / "bin" / "uv"
    if not binary.exists():
        say(f"images: installing uv {UV_VERSION} from PyPI into {venv}")
        _run([sys.executable, "-m", "venv", str(venv)], env=os.environ, what="venv")
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", f"uv=={UV_VERSION}"]
        _run(pip, env=os.environ, what="pip install uv")
    return binary


def _dependencies(pyproject: Path) -> list[str]:
    with pyproject.open("rb") as f:
        return [str(r) for r in tomllib.load(f)["project"]["dependencies"]]


def runtime_requirements() -> list[str]:
    """What the images install from the lock: ``pyproject.toml``'s dependencies, each of the
    project's own distributions replaced by its own dependencies."""
    required: list[str] = []
    for requirement in _dependencies(ROOT / "pyproject.toml"):
        name = re.split(r"[\s\[<>=!~;@]", requirement, maxsplit=1)[0].lower()
        local = LOCAL_DISTRIBUTIONS.get(name)
        required += [requirement] if local is None else _dependencies(local / "pyproject.toml")
    return required


def build_requirements() -> list[str]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return [str(r) for r in tomllib.load(f)["build-system"]["requires"]]


def lock(*, say: Say = _say, upgrade: bool = False) -> None:
    """Write ``requirements/images.lock`` and ``requirements/build.lock`` (hashed pins)."""
    binary = uv(say=say)
    common = [
        str(binary),
        "pip",
        "compile",
        "--quiet",
        "--generate-hashes",
        f"--python-version={PYTHON}",
        "--python-platform=linux",
        "--only-binary=:all:",
        f"--custom-compile-command={LOCK_COMMAND}",
        *(["--upgrade"] if upgrade else []),
    ]
    env = {**os.environ, "UV_NO_CONFIG": "1"}
    # The project's own distributions resolve to their folders here and are left out of the lock.
    local = "".join(f"./{path.relative_to(ROOT)}\n" for path in LOCAL_DISTRIBUTIONS.values())
    unlisted = [f"--no-emit-package={name}" for name in LOCAL_DISTRIBUTIONS]
    command = [*common, *unlisted, "pyproject.toml", "-", "-o", str(LOCK)]
    result = subprocess.run(command, env=env, cwd=ROOT, input=local, text=True, check=False)
    if result.returncode != 0:
        raise ImagesError(f"uv pip compile (runtime) failed (exit {result.returncode})")
    requirements = "\n".join(build_requirements()) + "\n"
    command = [*common, "-", "-o", str(BUILD_LOCK)]
    result = subprocess.run(command, env=env, cwd=ROOT, input=requirements, text=True, check=False)
    if result.returncode != 0:
        raise ImagesError(f"uv pip compile (build tools) failed (exit {result.returncode})")
    say(f"images: wrote {LOCK.relative_to(ROOT)} and {BUILD_LOCK.relative_to(ROOT)}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m devcluster.images", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    build_cmd = sub.add_parser("build", help="build both images into build/*.oci.tar (default)")
    build_cmd.add_argument(
        "--refresh-base",
        action="store_true",
        help="make the base root again from Debian's current packages (security updates)",
    )
    lock_cmd = sub.add_parser("lock", help="regenerate requirements/*.lock from pyproject.toml")
    lock_cmd.add_argument("--upgrade", action="store_true", help="take the newest versions")
    args = parser.parse_args(argv)
    try:
        if args.command == "lock":
            lock(upgrade=args.upgrade)
        else:
            build(refresh_base=getattr(args, "refresh_base", False))
    except ImagesError as error:
        _say(f"images: {error}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
