"""Every task of the ciclo monorepo is a nox session (uv backend).

nox                      # lint, typecheck and every test session
nox -s demo              # the README demo
nox -s "tests-3.11(package='core')"
"""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path

import nox

nox.needs_version = ">=2024.4.15"
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["lint", "typecheck", "tests", "extras", "docs", "bench_tiny"]
nox.options.error_on_external_run = True

ROOT = Path(__file__).parent
DIST = ROOT / "dist"
PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")
PYTHONS = ["3.11", "3.13"]  # the oldest supported, and the newest (with the newest jax)
ADAPTERS = ("flax", "haiku", "equinox")
ENV = {
    # Tests run on 8 simulated devices so multi-device code is exercised on every run.
    "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
    "JAX_PLATFORMS": "cpu",
    "UV_COMPILE_BYTECODE": "1",
    "PYTHONDONTWRITEBYTECODE": "",
    "TF_CPP_MIN_LOG_LEVEL": "3",
}


def _expose_pyenv_pythons() -> None:
    """Puts every pyenv-installed Python 3.11+ on PATH, so nox finds e.g. python3.13
    without pyenv shims (which only answer for the active version)."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    bins = sorted(glob.glob(os.path.join(root, "versions", "3.1[1-9].*", "bin")))
    if bins:
        os.environ["PATH"] = os.pathsep.join([*bins, os.environ.get("PATH", "")])


_expose_pyenv_pythons()


def _packages(*names: str) -> list[str]:
    args: list[str] = []
    for name in ("core", *names):
        args += ["-e", str(ROOT / "packages" / f"ciclo-{name}")]
    return args


def _install_tests(session: nox.Session, *adapters: str) -> None:
    session.install(*_packages(*adapters), *nox.project.dependency_groups(PYPROJECT, "test"))


@nox.session(python=PYTHONS[0])
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "lint"))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHONS[0])
def typecheck(session: nox.Session) -> None:
    """mypy --strict on ciclo-core's public API."""
    session.install(*_packages(), *nox.project.dependency_groups(PYPROJECT, "typecheck"))
    session.run("mypy", "packages/ciclo-core/src/ciclo")


@nox.session(python=PYTHONS)
@nox.parametrize("package", ["core", *ADAPTERS, "integration"])
def tests(session: nox.Session, package: str) -> None:
    """One package's tests (core alone has no framework installed), or the cross-package
    tests in tests/ with every adapter installed."""
    if package == "core":
        _install_tests(session)
        # the optional extras, so their callbacks (tensorboard_logger, History.plot) are tested
        session.install("-e", f"{ROOT / 'packages' / 'ciclo-core'}[tensorboard,plot]")
        paths = ["packages/ciclo-core/tests"]
    elif package == "integration":
        _install_tests(session, *ADAPTERS)
        session.install("tensorboardX", "matplotlib", "scikit-learn")
        # tests/extras need the extras (`nox -s extras`), tests/docs_site the site (`nox -s docs`)
        paths = ["tests", "--ignore=tests/extras", "--ignore=tests/docs_site"]
    else:
        _install_tests(session, package)
        paths = [f"packages/ciclo-{package}/tests"]
    workers = str(min(4, os.cpu_count() or 1))
    session.run(
        "pytest", "-q", "-p", "no:cacheprovider", "-n", workers, *paths, *session.posargs, env=ENV
    )


@nox.session(python=PYTHONS[0])
def extras(session: nox.Session) -> None:
    """The optional integrations (trackers, metric libraries, data pipelines) with the real
    packages: the tests in tests/extras/, every adapter installed."""
    _install_tests(session, *ADAPTERS)
    session.install(
        "-e",  # editable, as _install_tests made it: a reused venv tests the checkout
        f"{ROOT / 'packages' / 'ciclo-core'}[tensorboard,plot]",
        *nox.project.dependency_groups(PYPROJECT, "extras"),
    )
    workers = str(min(4, os.cpu_count() or 1))
    session.run(
        "pytest", "-q", "-p", "no:cacheprovider", "-n", workers, "tests/extras",
        *session.posargs, env=ENV,
    )  # fmt: skip


# Sphinx roles that mkdocstrings would show as text (docs/_ext/griffe_roles.py links them).
RAW_ROLES = (":func:", ":class:", ":meth:", ":mod:", ":attr:", ":data:", ":exc:", ":obj:")


@nox.session(python=PYTHONS[0])
def docs(session: nox.Session) -> None:
    """The documentation site (mkdocs-material; the API reference generated from the
    docstrings by mkdocstrings, read from the source without importing it), built with
    warnings as errors into site/, then checked: no raw cross-reference role in its HTML,
    and two pages opened in headless Chromium (tests/docs_site/; Debian's chromium is
    installed with apt-get when missing and possible, else the browser test says why it
    skips). The pages' code blocks run in the integration tests."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "docs"))
    site = ROOT / "site"
    session.run(
        "mkdocs", "build", "--strict", "--site-dir", str(site), *session.posargs,
        env={"NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    raw = [
        f"{page.relative_to(site)}: {role}"
        for page in sorted(site.rglob("*.html"))
        for role in RAW_ROLES
        if role in page.read_text(encoding="utf-8")
    ]
    if raw:
        session.error(f"raw cross-reference roles in the built site: {raw[:20]}")
    _install_chromium(session)
    session.install(*nox.project.dependency_groups(PYPROJECT, "docs_browser"))
    session.run(
        "pytest", "-q", "-p", "no:cacheprovider", "-rs", "tests/docs_site",
        env={"CICLO_SITE": str(site)},
    )  # fmt: skip


def _install_chromium(session: nox.Session) -> None:
    """Debian's chromium package for the browser test, when it is missing and this
    machine has apt-get and root (a CI machine); otherwise the test skips, saying why."""
    if any(shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")):
        return
    if shutil.which("apt-get") is None or not hasattr(os, "geteuid") or os.geteuid() != 0:
        session.log("no chromium, and no apt-get as root to install it: the browser test skips")
        return
    # A failure here only leaves the browser test to skip, saying why.
    session.run("apt-get", "update", external=True, silent=True, success_codes=[0, 100])
    session.run(
        "apt-get", "install", "-y", "--no-install-recommends", "chromium",
        external=True, silent=True, success_codes=[0, 100],
    )  # fmt: skip


@nox.session(python=PYTHONS[0])
def demo(session: nox.Session) -> None:
    """The README demo: a Flax MLP trained on scikit-learn's digits with train_loop (progress
    bar, evaluation each epoch, final test accuracy, a PNG plot in examples/out/)."""
    session.install(*_packages("flax"), f"{ROOT / 'packages' / 'ciclo-core'}[plot]", "scikit-learn")
    session.run("python", "examples/demo.py", *session.posargs, env=ENV)


@nox.session(python=PYTHONS[0])
def examples(session: nox.Session) -> None:
    """Every script in examples/, at a small size (--steps 30)."""
    session.install(
        *_packages(*ADAPTERS), f"{ROOT / 'packages' / 'ciclo-core'}[plot]", "scikit-learn", "pytest"
    )
    scripts = sorted(p.name for p in (ROOT / "examples").glob("*.py") if not p.name.startswith("_"))
    small = {
        "demo.py": ["--min-accuracy", "0", "--plot", "examples/out/demo-small.png"],
        "language_model.py": ["--batch-size", "8", "--generate", "16"],
    }
    for script in scripts:
        session.run(
            "python", f"examples/{script}", "--steps", "30", *small.get(script, []), env=ENV
        )


def _install_bench(session: nox.Session) -> None:
    # pytest: ciclo.testing (the loopback job of multihost_agreement.py) imports it;
    # scikit-learn: the digits of examples/digits_cnn.py (restart.py).
    session.install(*_packages(*ADAPTERS), "keras>=3", "pytest>=8", "scikit-learn")


@nox.session(python=PYTHONS[0])
def bench(session: nox.Session) -> None:
    """Every benchmark at full size, side by side with its hand-written baseline;
    writes benchmarks/RESULTS.md."""
    _install_bench(session)
    session.run("python", "benchmarks/run.py", *session.posargs, env={**ENV, "XLA_FLAGS": ""})


@nox.session(python=PYTHONS[0])
def bench_tiny(session: nox.Session) -> None:
    """Every benchmark at a tiny size (CI), so they keep working."""
    _install_bench(session)
    session.run("python", "benchmarks/run.py", "--tiny", env={**ENV, "XLA_FLAGS": ""})


def _build(session: nox.Session) -> None:
    session.install("uv")
    shutil.rmtree(DIST, ignore_errors=True)
    for name in ("core", *ADAPTERS):
        package = ROOT / "packages" / f"ciclo-{name}"
        session.run("uv", "build", "--quiet", "--out-dir", str(DIST), str(package))


@nox.session(python=PYTHONS[0])
def build(session: nox.Session) -> None:
    """Wheels and sdists of the four packages, in dist/."""
    _build(session)
    session.log("built: " + ", ".join(sorted(p.name for p in DIST.glob("ciclo*"))))


@nox.session(python=PYTHONS[0])
def wheels(session: nox.Session) -> None:
    """Builds the packages, installs each built wheel into a fresh virtual environment (an
    adapter pulls ciclo-core from dist/, never from the source tree), and runs its
    conformance suite and tests/installed_smoke.py there, from a directory outside the
    source tree."""
    _build(session)
    tmp = Path(session.create_tmp()).resolve()
    workers = str(min(4, os.cpu_count() or 1))
    test_deps = nox.project.dependency_groups(PYPROJECT, "test")
    for name in ("core", *ADAPTERS):
        venv = tmp / f"venv-{name}"
        shutil.rmtree(venv, ignore_errors=True)
        session.run("uv", "venv", "--quiet", "--python", str(PYTHONS[0]), str(venv))
        python = str(venv / "bin" / "python")
        ciclo = ["ciclo-core"] + ([f"ciclo-{name}"] if name != "core" else [])
        # The ciclo packages from dist/ only (no index), then what they need from PyPI: the
        # resolver keeps the installed ciclo packages, which satisfy the adapters' range.
        install = ("uv", "pip", "install", "--quiet", "--python", python)
        session.run(*install, "--no-index", "--find-links", str(DIST), "--no-deps", *ciclo)
        session.run(*install, "--find-links", str(DIST), *ciclo, *test_deps)
        work = tmp / f"run-{name}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        shutil.copy(ROOT / "tests" / "installed_smoke.py", work)
        with session.chdir(work):
            session.run(python, "installed_smoke.py", name, env=ENV, external=True)
            if name != "core":
                shutil.copy(
                    ROOT / "packages" / f"ciclo-{name}" / "tests" / "test_conformance.py", work
                )
                session.run(
                    python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", workers,
                    "test_conformance.py", env=ENV, external=True,
                )  # fmt: skip


# Old matplotlib with the newest pyparsing (resolved highest, as a transitive dependency)
# warns on import; not ciclo's concern, so not an error in the lowest session.
_LOWEST_WARNINGS = ["-W", "ignore:'enablePackrat' deprecated:DeprecationWarning"]
_BOUNDED = (
    "jax jaxlib numpy optax orbax-checkpoint tqdm tensorboardX matplotlib flax dm-haiku equinox"
)
_SHOW_VERSIONS = (
    "from importlib.metadata import version\n"
    f"print('lowest:', ', '.join(f'{{n}}=={{version(n)}}' for n in {_BOUNDED.split()!r}))"
)


@nox.session(python=PYTHONS[0])
def lowest(session: nox.Session) -> None:
    """The declared lower bounds (uv --resolution lowest-direct) of jax, numpy, optax,
    orbax-checkpoint, tqdm, the extras, flax, dm-haiku and equinox: core tests and each
    adapter's conformance suite."""
    core = f"{ROOT / 'packages' / 'ciclo-core'}[tensorboard,plot]"
    adapters = [
        arg for name in ADAPTERS for arg in ("-e", str(ROOT / "packages" / f"ciclo-{name}"))
    ]
    session.install(
        "--resolution", "lowest-direct", "-e", core, *adapters,
        *nox.project.dependency_groups(PYPROJECT, "test"),
    )  # fmt: skip
    session.run("python", "-c", _SHOW_VERSIONS)
    paths = ["packages/ciclo-core/tests"]
    paths += [f"packages/ciclo-{name}/tests/test_conformance.py" for name in ADAPTERS]
    workers = str(min(4, os.cpu_count() or 1))
    session.run(
        "pytest", "-q", "-p", "no:cacheprovider", "-n", workers, *_LOWEST_WARNINGS, *paths,
        *session.posargs, env=ENV,
    )  # fmt: skip
