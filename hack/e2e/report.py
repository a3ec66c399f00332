"""Check results: a line per check as it finishes, the final count, JUnit XML."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO


@dataclass(frozen=True)
class Result:
    name: str
    failure: str | None  # None: passed, or not applicable
    seconds: float
    # Why the behaviour cannot apply to this backend: neither passed nor failed.
    not_applicable: str | None = None

    @property
    def passed(self) -> bool:
        return self.failure is None and self.not_applicable is None

    def line(self) -> str:
        if self.not_applicable is not None:
            return f"N/A  {self.name}: {self.not_applicable}"
        if self.failure is None:  # passed
            return f"PASS {self.name}"
        # One line per check: the details' line breaks become " | ".
        return f"FAIL {self.name}: {' | '.join(self.failure.splitlines())}"


class Report:
    def __init__(self, suite: str, out: TextIO) -> None:
        self.suite = suite
        self._out = out
        self.results: list[Result] = []
        self.notes: list[str] = []  # what the run was (its control plane...)
        self._started = time.monotonic()

    def note(self, text: str) -> None:
        """A line about the run, before its results (and a JUnit property)."""
        self.notes.append(text)
        print(text, file=self._out, flush=True)

    def add(self, result: Result) -> None:
        self.results.append(result)
        print(result.line(), file=self._out, flush=True)

    @property
    def failed(self) -> int:
        return sum(r.failure is not None for r in self.results)

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def not_applicable(self) -> int:
        return sum(r.not_applicable is not None for r in self.results)

    def summary(self) -> str:
        text = f"{self.passed} passed, {self.failed} failed"
        return text + (f", {self.not_applicable} n/a" if self.not_applicable else "")

    def junit(self, path: Path) -> None:
        counts = {"tests": str(len(self.results)), "failures": str(self.failed), "errors": "0"}
        root = ET.Element("testsuites", counts)
        suite = ET.SubElement(root, "testsuite", counts, name=self.suite,
                              skipped=str(self.not_applicable),
                              time=f"{time.monotonic() - self._started:.3f}")
        if self.notes:
            properties = ET.SubElement(suite, "properties")
            for note in self.notes:
                name, _, value = note.partition(": ")
                ET.SubElement(properties, "property", name=name, value=value)
        for result in self.results:
            case = ET.SubElement(suite, "testcase", classname=self.suite, name=result.name,
                                 time=f"{result.seconds:.3f}")
            if result.not_applicable is not None:
                ET.SubElement(case, "skipped", message=f"n/a: {result.not_applicable}")
            elif result.failure is not None:
                failure = ET.SubElement(case, "failure",
                                        message=result.failure.splitlines()[0][:500])
                failure.text = result.failure
        ET.indent(root)
        ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
