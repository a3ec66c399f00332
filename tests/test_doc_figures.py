"""Each measured figure has one place, docs/bench.md (today's figures) or
docs/bench-history.md (those of each change, from then): the other docs (and
the manifests' comments) link to its section instead of quoting their own
copy, which went stale (issue 31: 161 and 361 MiB, 11.6 -> 3.84 s, 4.5 s).

What a test can tell apart without guessing: every MiB figure is a
measurement, but for the few sizes the code or a test sets; a seconds figure
is one where its paragraph says it was measured or points to the bench (the
others are timeouts, defaults and test parameters, which no pattern tells
from a measurement)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.deploy import DEPLOY, ROOT, daemonset_containers

DOCS = ROOT / "docs"
BENCH = DOCS / "bench.md"
HISTORY = DOCS / "bench-history.md"
# Sizes the code or a test sets, not measured: the trace ring buffer and the
# userspace proxy's default pipe; gRPC's default message limit, the probes'
# answer in a test and the soak's bound on memory growth.
SET_SIZES = {"1 MiB", "4 MiB"}
_FIGURE = re.compile(r"(?<![\w.,-])(\d{1,3}(?: \d{3})+|\d+(?:\.\d+)?) ?(MiB|GiB|ms|us|s)\b")
_MEASURED = re.compile(r"measur|bench(?:-history)?\.md", re.IGNORECASE)
_BENCH_LINK = re.compile(r"(?:\(|docs/)(bench(?:-history)?\.md)#([^)\s]+)")


def quoting_texts() -> dict[str, str]:
    """README.md, docs/*.md but the bench's two, and the comments of deploy/."""
    texts = {path.name: path.read_text() for path in (ROOT / "README.md", *DOCS.glob("*.md"))
             if path not in (BENCH, HISTORY)}
    for path in (*DEPLOY.rglob("*.yaml"), DEPLOY / "Dockerfile"):
        texts[str(path.relative_to(ROOT))] = "\n".join(
            line.split("#", 1)[1] if "#" in line else "" for line in path.read_text().splitlines())
    return texts


def units(text: str) -> list[tuple[str, bool]]:
    """(paragraph or table row, whether it reports a measurement): one that
    says so or points to the bench, or a row of a table that follows one."""
    found: list[tuple[str, bool]] = []
    for paragraph in re.split(r"\n\s*\n", text):
        lines = paragraph.strip().splitlines()
        if lines and all(line.lstrip().startswith("|") for line in lines):
            after_measured = bool(found) and found[-1][1]
            found += [(row, after_measured or bool(_MEASURED.search(row))) for row in lines]
        else:
            found.append((paragraph, bool(_MEASURED.search(paragraph))))
    return found


def in_bench(figure: str, bench: str) -> bool:
    return re.search(r"(?<![\w.,])" + re.escape(figure) + r"\b", bench) is not None


def flat(text: str) -> str:
    return " ".join(text.split())


def test_every_measured_figure_outside_the_bench_is_one_the_bench_has() -> None:
    bench = flat(BENCH.read_text() + "\n" + HISTORY.read_text())
    stray = []
    for name, text in quoting_texts().items():
        for unit, measured in units(text):
            for number, symbol in _FIGURE.findall(flat(unit)):
                figure = f"{number} {symbol}"
                if (symbol in ("MiB", "GiB") and figure not in SET_SIZES) or measured:
                    if not in_bench(figure, bench):
                        stray.append(f"{name}: {figure} in {flat(unit)[:100]!r}")
    assert stray == [], "link to docs/bench.md's section instead of quoting: " + "\n".join(stray)


def slug(heading: str) -> str:
    """A Markdown heading's anchor, as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def bench_sections(doc: Path = BENCH) -> dict[str, str]:
    """Each heading's anchor and its text, up to the next heading of its level or above."""
    sections: dict[str, str] = {}
    lines = doc.read_text().splitlines()
    for i, line in enumerate(lines):
        if heading := re.match(r"(#+) (.+)", line):
            level = len(heading[1])
            end = next((j for j in range(i + 1, len(lines))
                        if (h := re.match(r"(#+) ", lines[j])) and len(h[1]) <= level),
                       len(lines))
            sections[slug(heading[2])] = "\n".join(lines[i:end])
    return sections


def test_every_link_into_the_bench_names_a_section_it_has() -> None:
    anchors = {doc.name: bench_sections(doc) for doc in (BENCH, HISTORY)}
    linked = {(name, doc, anchor) for name, text in quoting_texts().items()
              for doc, anchor in _BENCH_LINK.findall(text)}
    assert len(linked) >= 10
    assert {link for link in linked if link[2] not in anchors[link[1]]} == set()


def test_every_link_between_the_bench_and_its_history_names_a_section() -> None:
    """The two files link each other's sections (and their own, by bare `#`)."""
    anchors = {doc.name: bench_sections(doc) for doc in (BENCH, HISTORY)}
    dangling = []
    for doc in (BENCH, HISTORY):
        text = doc.read_text()
        links = [*_BENCH_LINK.findall(text),
                 *((doc.name, a) for a in re.findall(r"\]\(#([^)\s]+)\)", text))]
        dangling += [(doc.name, target, anchor) for target, anchor in links
                     if anchor not in anchors[target]]
    assert dangling == []


def resources_comment(manifest: str = "kpng-py.yaml") -> str:
    """The comment right above the kpng-py container's `resources:`."""
    lines = (DEPLOY / manifest).read_text().splitlines()
    container = lines.index("        - name: kpng-py")
    at = next(i for i in range(container, len(lines)) if lines[i].strip() == "resources:")
    above: list[str] = []
    while lines[at - 1 - len(above)].strip().startswith("#"):
        above.append(lines[at - 1 - len(above)].strip().lstrip("# "))
    return " ".join(reversed(above))


def test_the_memory_request_holds_the_peak_the_current_bench_gives() -> None:
    """The one number that must stand in the manifest: derived from the
    figures its comment quotes, which the section it names has."""
    comment = resources_comment()
    (section,) = re.findall(r'docs/bench\.md, "([^"]+)"', comment)
    (anchor,) = [a for a in bench_sections() if a.startswith(slug(section))]
    peaks = [float(n) for n in re.findall(r"([\d.]+) MiB", comment)]
    assert len(peaks) >= 2
    assert all(in_bench(f"{peak:g} MiB", flat(bench_sections()[anchor])) for peak in peaks)
    request, limit = memory("kpng-py.yaml")
    assert max(peaks) <= request < limit


def memory(manifest: str) -> tuple[int, int]:
    """The kpng-py container's memory request and limit (MiB)."""
    resources = daemonset_containers(manifest)["kpng-py"]["resources"]
    mib = {"Mi": 1, "Gi": 1024}
    request, limit = (int(resources[k]["memory"][:-2]) * mib[resources[k]["memory"][-2:]]
                      for k in ("requests", "limits"))
    return request, limit


def test_the_one_container_layouts_request_holds_its_brain_and_its_backend() -> None:
    """Brain and backend in one container: the sum of the two peaks the
    comment quotes, each from the section it names."""
    comment = resources_comment("kpng-py-kube.yaml")
    named = re.findall(r'([\d.]+) MiB[^"]*?docs/bench\.md, "([^"]+)"', comment)
    assert len(named) == 2
    sections = bench_sections()
    for peak, section in named:
        (anchor,) = [a for a in sections if a.startswith(slug(section))]
        assert in_bench(f"{float(peak):g} MiB", flat(sections[anchor])), (peak, section)
    request, limit = memory("kpng-py-kube.yaml")
    assert sum(float(peak) for peak, _ in named) <= request < limit
