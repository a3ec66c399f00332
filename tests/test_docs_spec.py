"""The specs live in docs/spec/ (docs/spec/README.md): nothing in the
repository cites them anywhere else, every S and N item is defined there
once, every e2e check named after an item names a defined one and is listed
in the index under it, and the paths and links that lead there exist."""

from __future__ import annotations

import ast
import re
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "docs" / "spec"
SERVICE_PAGE, NODE_PORT_PAGE = SPEC / "service-behaviours.md", SPEC / "node-port-behaviours.md"
SERVICE_ITEMS = {f"S{n}" for n in range(1, 16)}
NODE_PORT_ITEMS = {f"N{n}" for n in range(1, 21)}
# Where the specs were before docs/spec/: a folder beside the checkout, and
# its page names. This file names them, so it is left out of the search.
OLD_PLACES = re.compile(rb"\.\./shared|shared/spec|service-semantics|nodeport-semantics"
                        rb"|socket-lb-notes|kpng-deployment|kpng-file-format")
SPEC_CITATION = re.compile(rb"docs/spec/([\w.-]+\.md)")
# An item's definition: a list entry that opens with its id in bold.
DEFINITION = re.compile(r"^- \*\*([SN]\d+)\*\*", re.MULTILINE)
ITEM_ID = re.compile(r"[SN]\d+")
E2E_CHECKS = {REPO / "hack/e2e/checks.py": "check",
              REPO / "hack/e2e/nodeport_checks.py": "nodeport_check"}
# Top-level folders whose paths the spec pages name in backquotes.
REPO_PATH = re.compile(r"`((?:tests|hack|docs|kpng_py|backends|lab|proto|deploy|bench)/[\w./-]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def repository_files() -> list[Path]:
    """The files of the checkout git would commit (tracked, or new and not
    ignored): .venv, build output and logs are left out by .gitignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True).stdout
    paths = (REPO / name for name in listed.decode().split("\0") if name)
    return sorted(path for path in paths if path.is_file())


def lines_matching(pattern: re.Pattern[bytes]) -> list[tuple[str, int, bytes]]:
    found: list[tuple[str, int, bytes]] = []
    for path in repository_files():
        if path == Path(__file__).resolve():
            continue
        for number, line in enumerate(path.read_bytes().splitlines(), 1):
            found.extend((str(path.relative_to(REPO)), number, match.group(0))
                         for match in pattern.finditer(line))
    return found


def definitions() -> dict[str, list[str]]:
    """Each item id defined on the spec pages, with the pages defining it."""
    pages: dict[str, list[str]] = defaultdict(list)
    for page in sorted(SPEC.glob("*.md")):
        for item in DEFINITION.findall(page.read_text()):
            pages[item].append(page.name)
    return pages


def _registered_name(node: ast.AST, register: str) -> str | None:
    """The name a call of `register` gives as its first argument, a string."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == register and node.args):
        return None
    first = node.args[0]
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def e2e_checks() -> dict[str, set[str]]:
    """The e2e checks named after an item (`S7/client-ip-affinity`), by item:
    the first argument of each call of the topologies' register functions."""
    checks: dict[str, set[str]] = defaultdict(set)
    for path, register in E2E_CHECKS.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = _registered_name(node, register)
            if name is not None and ITEM_ID.fullmatch(item := name.split("/")[0]):
                checks[item].add(name)
    return checks


def index_rows() -> dict[str, set[str]]:
    """The index's table of where each item is checked: item -> e2e checks."""
    rows = {}
    for line in (SPEC / "README.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and ITEM_ID.fullmatch(cells[0]):
            rows[cells[0]] = set(re.findall(r"`([SN]\d+/[\w-]+)`", cells[1]))
    return rows


def anchors(page: Path) -> set[str]:
    """The anchors GitHub makes of a page's headings (outside code blocks)."""
    found, in_code = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (heading := re.match(r"#+ (.*)", line)):
            found.add(re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-"))
    return found


def test_nothing_cites_the_specs_outside_the_repository() -> None:
    assert lines_matching(OLD_PLACES) == [], "cite the page under docs/spec/ instead"


def test_citations_of_spec_pages_name_pages_that_exist() -> None:
    cited = lines_matching(SPEC_CITATION)
    assert cited, "nothing cites docs/spec/: is the pattern still right?"
    missing = [(path, number, citation) for path, number, citation in cited
               if not (REPO / citation.decode()).is_file()]
    assert missing == []


def test_every_item_is_defined_once_on_its_page() -> None:
    pages = definitions()
    assert {item: where for item, where in pages.items() if len(where) > 1} == {}
    assert SERVICE_ITEMS <= {item for item, where in pages.items()
                             if where == [SERVICE_PAGE.name]}
    assert NODE_PORT_ITEMS <= {item for item, where in pages.items()
                               if where == [NODE_PORT_PAGE.name]}


def test_every_e2e_check_named_after_an_item_names_a_defined_one() -> None:
    checks = e2e_checks()
    assert {item[0] for item in checks} == {"S", "N"}, "no e2e check found: moved or renamed?"
    assert set(checks) - set(definitions()) == set()


def test_the_index_lists_every_item_with_its_e2e_checks() -> None:
    checks = e2e_checks()
    assert index_rows() == {item: checks.get(item, set()) for item in definitions()}


@pytest.mark.parametrize("page", sorted(SPEC.glob("*.md")), ids=lambda page: page.name)
def test_the_paths_a_spec_page_names_exist(page: Path) -> None:
    assert [path for path in REPO_PATH.findall(page.read_text())
            if not (REPO / path).exists()] == []


def test_links_of_the_markdown_pages_lead_somewhere() -> None:
    """Every page, as citations of docs/spec/ come from all of them."""
    broken = []
    for page in (path for path in repository_files() if path.suffix == ".md"):
        for link in LINK.findall(page.read_text()):
            if "://" in link:
                continue
            target, _, anchor = link.partition("#")
            target_path = (page.parent / target).resolve() if target else page
            if not target_path.exists() or (anchor and target_path.suffix == ".md"
                                            and anchor not in anchors(target_path)):
                broken.append(f"{page.relative_to(REPO)}: {link}")
    assert broken == []
