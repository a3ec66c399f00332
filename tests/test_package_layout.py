"""The direction of imports between the product's packages: the flow of
docs/architecture.md ("Packages"), held by the code. A package imports only
the packages below it: the state never imports the transport that brought
its ops, no backend imports a command or a brain, and so on. And the tests
mirror the code: each module's test is found by its name and folders."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_BASE = {"api", "model", "runtime"}
# Each part of kpng_py (a package, or a module at the top) and the parts it
# may import.
MAY_IMPORT: dict[str, set[str]] = {
    "api": set(),
    "model": set(),
    "runtime": set(),
    "transport": {"model"},
    "metrics": {"model", "runtime"},
    "node": {"model", "runtime"},
    "state": _BASE | {"metrics"},
    "watch": _BASE | {"transport", "metrics", "state"},
    "serve": _BASE | {"transport"},
    "healthcheck": _BASE | {"metrics", "node", "watch"},
    "dataplane": _BASE | {"metrics", "node", "state", "healthcheck"},
    "brain": _BASE | {"metrics", "serve", "state", "healthcheck"},
    "cmd": _BASE | {"transport", "metrics", "node", "state", "watch", "serve", "healthcheck",
                    "dataplane", "brain"},
}
# A backend is a dataplane: it may import what a dataplane needs, and its
# declaration module (cli.py) the values of the command line's flags.
BACKEND_MAY_IMPORT = _BASE | {"metrics", "node", "state", "healthcheck", "dataplane"}
BACKEND_FLAG_MODULES = {"kpng_py.cmd.durations", "kpng_py.cmd.flag_types"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in names if name.startswith("kpng_py.")}


def _part(module: str) -> str:
    return module.split(".")[1]


def _part_of_file(path: Path) -> str:
    relative = path.relative_to(ROOT / "kpng_py")
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def _known(module: str) -> bool:
    return _part(module) in MAY_IMPORT or _part(module) == "__version__"


def test_every_part_of_kpng_py_has_its_rule():
    parts = {_part_of_file(path) for path in (ROOT / "kpng_py").rglob("*.py")} - {"__init__"}
    assert parts == set(MAY_IMPORT)


@pytest.mark.parametrize("part", sorted(MAY_IMPORT))
def test_a_part_of_kpng_py_imports_only_the_parts_below_it(part):
    sources = [path for path in (ROOT / "kpng_py").rglob("*.py") if _part_of_file(path) == part]
    wrong = {str(path.relative_to(ROOT)): sorted(
        module for module in _imports(path)
        if _known(module) and _part(module) not in MAY_IMPORT[part] | {part, "__version__"})
        for path in sources}
    assert {path: modules for path, modules in wrong.items() if modules} == {}


@pytest.mark.parametrize("backend", ["ebpf", "userspace"])
def test_a_backend_imports_neither_a_command_nor_a_brain_nor_a_stream(backend):
    wrong = {}
    for path in (ROOT / "backends" / backend).rglob("*.py"):
        allowed = BACKEND_FLAG_MODULES if path.name == "cli.py" else set()
        modules = sorted(module for module in _imports(path)
                         if _part(module) not in BACKEND_MAY_IMPORT
                         and not any(module.startswith(flag) for flag in allowed))
        if modules:
            wrong[str(path.relative_to(ROOT))] = modules
    assert wrong == {}


def test_the_rule_catches_a_wrong_import(tmp_path):
    """The check reads `from kpng_py.X import Y` as importing part X."""
    source = tmp_path / "m.py"
    source.write_text("from kpng_py.watch.client import WatchClient\nimport kpng_py.serve.server\n")
    assert {_part(module) for module in _imports(source)} == {"watch", "serve"}


# -- the tests mirror the code -------------------------------------------------


def _product_modules() -> list[Path]:
    """The modules of kpng_py/ and backends/, but for package files and the
    generated protobuf code."""
    return sorted(path for top in ("kpng_py", "backends") for path in (ROOT / top).rglob("*.py")
                  if path.name != "__init__.py" and not path.name.endswith("_pb2.py"))


def mirrored_tests(module: Path) -> tuple[Path, Path]:
    """Where a module's test is: test_<its name>.py under tests/, or under
    tests/kernel/ if it needs the kernel, in the module's own folders below
    kpng_py/ or backends/ (kpng_py/state/decode.py: tests/state/test_decode.py;
    backends/ebpf/netfilter/plan.py: tests/ebpf/netfilter/test_plan.py)."""
    folders = Path(*module.relative_to(ROOT).parts[1:-1])
    name = f"test_{module.stem}.py"
    return ROOT / "tests" / folders / name, ROOT / "tests" / "kernel" / folders / name


@pytest.mark.parametrize("module", _product_modules(),
                         ids=lambda module: str(module.relative_to(ROOT)))
def test_a_module_has_a_test_of_its_name_in_its_folders(module: Path) -> None:
    unit, kernel = mirrored_tests(module)
    assert unit.exists() or kernel.exists(), (
        f"{module.relative_to(ROOT)}: its tests belong in {unit.relative_to(ROOT)} "
        f"(or {kernel.relative_to(ROOT)} if they need the kernel)")


def test_the_mirror_rule_maps_each_tree_to_its_folders() -> None:
    assert mirrored_tests(ROOT / "kpng_py/transport.py")[0] == ROOT / "tests/test_transport.py"
    assert mirrored_tests(ROOT / "backends/ebpf/netfilter/plan.py") == (
        ROOT / "tests/ebpf/netfilter/test_plan.py",
        ROOT / "tests/kernel/ebpf/netfilter/test_plan.py")


# -- a test imports no other test ----------------------------------------------


def _tests_imported(path: Path, root: Path = ROOT) -> set[str]:
    """The `tests.` modules a module below `root` imports, relative imports
    resolved; `from M import N` counts as importing M and M.N (N may be a
    module)."""
    package = path.relative_to(root).parent.parts
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else ()
            module = ".".join((*base, *([node.module] if node.module else [])))
            names |= {module} | {f"{module}.{alias.name}" for alias in node.names}
    return {name for name in names if name.startswith("tests.")}


def _is_a_test_or_conftest(module: str, root: Path = ROOT) -> bool:
    path = root.joinpath(*module.split(".")).with_suffix(".py")
    return path.is_file() and (path.stem.startswith("test_") or path.stem == "conftest")


def modules_importing_tests(root: Path = ROOT) -> dict[str, list[str]]:
    """Each module below root/tests that imports a test_*.py or a conftest.py,
    with those it imports."""
    wrong = {str(path.relative_to(root)): sorted(
        module for module in _tests_imported(path, root) if _is_a_test_or_conftest(module, root))
        for path in sorted((root / "tests").rglob("*.py"))}
    return {path: modules for path, modules in wrong.items() if modules}


def test_no_module_of_the_tests_imports_a_test_or_a_conftest() -> None:
    """What tests share (helpers, constants, fixtures) lives in tests/support/;
    a conftest.py takes its fixtures from there too."""
    assert modules_importing_tests() == {}


def test_the_rule_catches_a_test_imported_absolutely_or_relatively(tmp_path: Path) -> None:
    folder = tmp_path / "tests" / "a"
    folder.mkdir(parents=True)
    for name in ("conftest.py", "test_one.py", "helpers.py"):
        (folder / name).write_text("X = 1\n")
    (folder / "test_two.py").write_text(
        "from .test_one import X\nfrom . import conftest, helpers\nimport tests.a.helpers\n")
    (tmp_path / "tests" / "test_three.py").write_text(
        "from tests.a.conftest import X\nfrom .a import test_one\nfrom .a.helpers import X\n")
    assert modules_importing_tests(tmp_path) == {
        "tests/a/test_two.py": ["tests.a.conftest", "tests.a.test_one"],
        "tests/test_three.py": ["tests.a.conftest", "tests.a.test_one"]}


# The one shared module outside tests/support/: the generator of the recorded
# streams beside it (docs/recording-format.md), whose builders the tests use.
STREAMS_BUILDER = "tests/streams/build.py"


def test_what_tests_share_is_in_tests_support() -> None:
    """A module of the tests that is neither a test, a conftest.py nor a
    package is shared code: it lives in tests/support/."""
    shared = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("*.py")
                    if not path.stem.startswith("test_")
                    and path.name not in ("conftest.py", "__init__.py")
                    and path.parent.relative_to(ROOT).parts[:2] != ("tests", "support"))
    assert shared == [STREAMS_BUILDER]
