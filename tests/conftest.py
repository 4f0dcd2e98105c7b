import ast
import os
from pathlib import Path

import pytest

import llmbuild  # noqa: F401  (first: it pins OpenBLAS's kernels before anything loads numpy)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Every build step the tests run fails if it reads a recipe field its descriptor does not declare
# (llmbuild/recipe/reads.py): a declaration cannot fall behind the code.
os.environ["LLMBUILD_STRICT_READS"] = "1"
# Every `snakemake` the tests start reads tests/snakemake-profile (nolock): the two pytest workers start
# Snakemake runs in the repository at once, into build directories that never overlap, and one run's
# clean-up of the shared .snakemake/locks folder would break the other's lock. A run with its own
# `--profile` (the SLURM tests) says --nolock itself.
os.environ["SNAKEMAKE_PROFILE"] = str(Path(__file__).parent / "snakemake-profile")

RUNTIME_RECIPES = ("qwen2_tiny_f32", "llama_tiny_f32", "smollm2_135m_bf16")


# The fixtures on the session's build directory: Snakemake builds it incrementally, one run at a time, and
# a test reads what the last run wrote, so the tests that use them run on one pytest worker, in order.
SESSION_BUILD_FIXTURES = frozenset({"build_root", "runtime_build"})


def _tests_on_the_session_build(tests: Path) -> frozenset[tuple[str, str]]:
    """(file, function) of each test taking one of SESSION_BUILD_FIXTURES, itself or through its file's
    fixtures (read from the source: the controller that schedules never imports the test files)."""
    found = set()
    for path in tests.glob("test_*.py"):
        tree = ast.parse(path.read_text(), str(path))
        takes = {f.name: {a.arg for a in f.args.args} for f in tree.body if isinstance(f, ast.FunctionDef)}
        found |= {(path.name, name) for name in takes if name.startswith("test_") and _uses(takes, name)}
    return frozenset(found)


def _uses(takes: dict[str, set[str]], name: str, seen: frozenset[str] = frozenset()) -> bool:
    args = takes.get(name, set())
    return bool(args & SESSION_BUILD_FIXTURES) or any(_uses(takes, a, seen | {name}) for a in args - seen)


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """pytest-xdist's scheduler (`-n 2`, pyproject's addopts): the tests on the session's build directory run
    together on one worker, and the other tests of a file together on one worker (its module fixtures made
    once)."""
    from xdist.scheduler import LoadScopeScheduling

    shared = _tests_on_the_session_build(Path(__file__).parent)

    class SessionBuildOrFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path, _, test = nodeid.partition("::")
            return "session-build" if (Path(path).name, test.split("[")[0]) in shared else path

    return SessionBuildOrFile(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `longer` repeat, end to end and at a minute or more each, what a quicker test already
    holds (which one is named in each test's marker): the README's command keeps CI within its time, and
    LLMBUILD_LONGER_TESTS=1 runs them too."""
    if os.environ.get("LLMBUILD_LONGER_TESTS") == "1":
        return
    for item in items:
        marker = item.get_closest_marker("longer")
        if marker is not None:
            item.add_marker(pytest.mark.skip(reason=f"longer variant of {marker.args[0]} (LLMBUILD_LONGER_TESTS=1)"))


@pytest.fixture(scope="session")
def build_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build directory for the whole test session. Snakemake builds into it incrementally, so a recipe
    one test file needs is built once, whichever file asks first."""
    return tmp_path_factory.mktemp("llmbuild") / "build"


@pytest.fixture(scope="session")
def runtime_build(build_root: Path) -> Path:
    """The binaries the runtime tests use, built from clean (a no-op when `all` was built already).

    LLMBUILD_TEST_PREBUILT=DIR uses binaries already built in DIR instead (a quick loop while working on
    the runtime; CI never sets it)."""
    from helpers import snakemake

    prebuilt = os.environ.get("LLMBUILD_TEST_PREBUILT")
    if prebuilt:
        return Path(prebuilt)
    snakemake(build_root, *RUNTIME_RECIPES)
    return build_root


# The vendor's cmodel keeps its engine threads polling busily until the process exits once a bmodel was loaded
# (runtime/bmodel_cmodel.py): in the test process they would take a core from every later test. Tests run it
# in subprocesses; this guard names the module that did not.
_CMODEL_THREADS = ("CORE_MAIN", "TPU_BD", "TPU_GDMA")


def _cmodel_threads() -> list[str]:
    names = []
    for comm in Path("/proc/self/task").glob("*/comm"):
        try:
            name = comm.read_text().strip()
        except OSError:
            continue
        if name in _CMODEL_THREADS:
            names.append(name)
    return names


@pytest.fixture(autouse=True, scope="module")
def _no_cmodel_left_running(request: pytest.FixtureRequest):
    yield
    left = _cmodel_threads()
    assert not left, (f"{request.module.__name__} left the vendor's cmodel running in the test process "
                      f"({', '.join(left)} threads spin until exit): run it in a subprocess")
