"""The one registry of backends: it lists every backend folder, each
declaration is complete, and the command line, the e2e harness and the bench
all take their backends from it (a new backend module shows up in the
command line, and in the harness and the bench once lab.backends has its
lab facts)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from kpng_py.cmd.cli import build_parser, main
from kpng_py.dataplane import registry
from kpng_py.dataplane.registry import BackendSpec, RegistryError
from kpng_py.metrics.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]

FAKE_MODULE = "kpng_py_test_fake_backend"
FAKE_SOURCE = '''
from kpng_py.dataplane.registry import BackendSpec, ToolCommand


class FakeBackend:
    def __init__(self, flag):
        self.flag = flag

    def setup(self):
        pass

    def apply(self, changes):
        pass

    def close(self):
        pass


def _add_arguments(parser):
    parser.add_argument("--fake-flag", default="unset", help="a flag of the fake backend")


def _add_tool_arguments(parser):
    parser.add_argument("--say", default="hello")


BACKEND = BackendSpec(
    name="fake", help="a backend that only the registry tests know",
    add_arguments=_add_arguments,
    create=lambda args, metrics: FakeBackend(args.fake_flag),
    tool=ToolCommand(name="fake", help="the fake backend's tool",
                     description="The fake backend's tool.",
                     add_arguments=_add_tool_arguments,
                     run=lambda args: print(f"fake tool says {args.say}")),
)
'''
# Registers the fake module in a fresh interpreter, as `fake_backend` does here,
# and gives the lab its facts (the entry a new backend adds to lab.backends).
_REGISTER_FAKE = f'''
import sys, types
from kpng_py.dataplane import registry
from lab import backends
module = types.ModuleType({FAKE_MODULE!r})
exec({FAKE_SOURCE!r}, module.__dict__)
sys.modules[{FAKE_MODULE!r}] = module
registry.BACKEND_MODULES = (*registry.BACKEND_MODULES, {FAKE_MODULE!r})
backends.LAB_SUPPORT = {{**backends.LAB_SUPPORT, "fake": backends.LabSupport(
    flags=lambda places: ["--fake-flag", places.service_interface],
    capacity_flags=lambda service_ports, endpoints: [],
    inspect=lambda places: ["true"],
    cleanup=lambda places: None,
    translates_in_pod=False, survives_restart=False, sockets_per_service_port=0)}}
'''


@pytest.fixture
def fake_backend(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A backend module that is only in the list, as a new backend would be."""
    module = types.ModuleType(FAKE_MODULE)
    exec(FAKE_SOURCE, module.__dict__)
    monkeypatch.setitem(sys.modules, FAKE_MODULE, module)
    monkeypatch.setattr(registry, "BACKEND_MODULES", (*registry.BACKEND_MODULES, FAKE_MODULE))
    return module


def _choices(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return action.choices


def test_every_backend_folder_is_registered() -> None:
    folders = {path.parent.name for path in (ROOT / "backends").glob("*/cli.py")}
    assert folders == {"ebpf", "userspace"}
    assert [spec.name for spec in registry.registered()] == ["print", *sorted(folders)]
    assert {f"backends.{name}.cli" for name in folders} <= set(registry.BACKEND_MODULES)


def test_every_backend_is_a_sink_of_local_and_of_file_to_local() -> None:
    commands = _choices(build_parser())
    local_sinks = _choices(commands["local"])
    to_local_sinks = _choices(_choices(commands["file"])["to-local"])
    assert list(local_sinks) == list(to_local_sinks) == list(registry.by_sink())


@pytest.mark.parametrize("spec", registry.registered(), ids=lambda spec: spec.name)
def test_each_declaration_is_complete(spec: BackendSpec) -> None:
    commands = _choices(build_parser())
    assert _choices(commands["local"])[spec.sink].description == spec.help
    if spec.tool is not None:
        assert commands[spec.tool.name].description == spec.tool.description


def test_a_new_backend_module_appears_in_the_cli(fake_backend, capsys) -> None:
    args = build_parser().parse_args(["local", "--api", "unix:///x.sock", "to-fake",
                                      "--fake-flag", "set"])
    backend = args.create_backend(args, Metrics())
    assert isinstance(backend, fake_backend.FakeBackend) and backend.flag == "set"
    with pytest.raises(SystemExit):
        main(["file", "-i", "state.yaml", "to-local", "--help"])
    assert "to-fake" in capsys.readouterr().out
    assert main(["fake", "--say", "hi there"]) == 0
    assert capsys.readouterr().out == "fake tool says hi there\n"


def _run_with_fake(code: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-c", _REGISTER_FAKE + code], cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_e2e_harness_takes_its_backends_from_the_registry() -> None:
    out = _run_with_fake(
        "import json\nfrom e2e.cli import build_parser\nfrom e2e.proxy import BACKENDS\n"
        "(b,) = [a for a in build_parser()._actions if a.dest == 'backend']\n"
        "print(json.dumps([list(b.choices), BACKENDS['fake'].sink_args(__import__("
        "'lab.names', fromlist=['RunNames']).RunNames(7))]))\n", ROOT / "hack")
    choices, sink_args = json.loads(out)
    assert choices == ["ebpf", "fake", "userspace"]
    assert sink_args == ["to-fake", "--fake-flag", "kpe7svc"]


def test_the_bench_takes_its_contenders_from_the_registry() -> None:
    out = _run_with_fake(
        "from bench.contenders import CONTENDERS\nprint(' '.join(CONTENDERS))\n", ROOT)
    assert out.split() == ["ebpf", "userspace", "fake", "iptables-legacy", "iptables-nft",
                           "nftables"]


def test_a_module_without_a_declaration_is_named(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, FAKE_MODULE, types.ModuleType(FAKE_MODULE))
    monkeypatch.setattr(registry, "BACKEND_MODULES", (*registry.BACKEND_MODULES, FAKE_MODULE))
    with pytest.raises(RegistryError, match=f"{FAKE_MODULE} declares no `BACKEND"):
        registry.registered()


def test_a_backend_registered_twice_is_named(monkeypatch) -> None:
    monkeypatch.setattr(registry, "BACKEND_MODULES",
                        (*registry.BACKEND_MODULES, "backends.ebpf.cli"))
    with pytest.raises(RegistryError, match="backend name ebpf is declared twice"):
        registry.registered()


@pytest.mark.parametrize("name", ["", "to-x", "Ebpf", "user space"])
def test_a_backend_name_must_make_a_sink(name: str) -> None:
    with pytest.raises(RegistryError, match="not lowercase letters and digits"):
        dataclasses.replace(registry.registered()[0], name=name)


def test_help_imports_neither_bcc_nor_pyroute2() -> None:
    """`kpng-py --help`, and the registry as the lab reads it, load every
    backend's declaration but none of the dataplanes' heavy modules."""
    heavy = ("bcc", "pyroute2", "backends.ebpf.datapath.loader", "backends.ebpf.backend",
             "backends.userspace.backend")
    code = ("import sys, contextlib, io\nfrom kpng_py.cmd.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "    main(['--help'])\n"
            "from kpng_py.dataplane import registry\nregistry.registered()\n"
            f"print(' '.join(m for m in sys.modules if m.startswith({heavy!r})))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []
