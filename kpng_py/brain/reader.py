"""Strict reading of one YAML document, with errors that say where.

`Value` wraps a node of the composed document together with its place: the
file, the path from the document's root (``services[0].endpoints[1].endpoint``)
and the line. Its typed accessors reject what does not fit, naming that place.
`Value.fill` reads a protobuf message the way KPNG's state file writes one:
keys are the message's field names lower-cased, enums are integers (or, for
people writing one, their names: `protocol: TCP`), a oneof is a mapping under
its own lower-cased name.

Like the upstream parser (Go's yaml.v2, strict mode): unknown and repeated keys
are errors; a null value is the same as an absent one; a string field takes
any scalar's text.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, NoReturn, Protocol, TypeVar

import yaml
from google.protobuf.descriptor import EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from kpng_py.brain.settings import StateFileError

# libyaml's parser when PyYAML was built with it (much faster on big files);
# both give the same nodes and line marks.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
M = TypeVar("M", bound=Message)
_TAG = "tag:yaml.org,2002:"
# A document's aliases may make it at most this many times its own size in
# nodes (and at least the floor), once expanded: see _check_alias_expansion.
ALIAS_EXPANSION_FACTOR = 10
ALIAS_EXPANSION_FLOOR = 100_000
# Where an alias may start (after a space, a flow indicator, at a line's
# start); a `*` inside a scalar makes only for a needless check.
_MAYBE_ALIAS = re.compile(r"(?:^|[\s\[{,])\*", re.MULTILINE)
INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_ENUM: (-(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_INT64: (-(1 << 63), (1 << 63) - 1),
    FieldDescriptor.TYPE_UINT32: (0, (1 << 32) - 1),
    FieldDescriptor.TYPE_UINT64: (0, (1 << 64) - 1),
}


class Blame(Protocol):
    """What a check blames: a Value (its place), or the fast path's stand-in."""

    def fail(self, problem: str) -> NoReturn: ...


# Extra checks by full name: a scalar field's (`localv1.IPSet.V4`) gets each value
# read (each element of a repeated field); a message's (`localv1.PortMapping`)
# gets the message once it is read. Both get the place to blame.
FieldChecks = dict[str, Callable[[Blame, Any], None]]


@dataclass(frozen=True)
class Place:
    file: str
    path: str
    line: int | None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{where}: {self.path}" if self.path else where


class Members(dict):
    """The members of a mapping by key; a key that is allowed but absent reads
    as a null value at the mapping's place."""

    def __init__(self, owner: Value, allowed: list[str]) -> None:
        super().__init__()
        self._owner = owner
        self._allowed = allowed

    def __missing__(self, key: str) -> Value:
        if key not in self._allowed:
            raise KeyError(key)
        owner = self._owner
        path = f"{owner.place.path}.{key}" if owner.place.path else key
        return Value(None, Place(owner.place.file, path, owner.place.line), owner.constructor)


class Value:
    """One node of the document (None when absent or null) and where it is."""

    def __init__(self, node: yaml.Node | None, place: Place,
                 constructor: yaml.constructor.SafeConstructor) -> None:
        if isinstance(node, yaml.ScalarNode) and node.tag == _TAG + "null":
            node = None
        self._node = node
        self.place = place
        self.constructor = constructor

    @property
    def is_null(self) -> bool:
        return self._node is None

    def fail(self, problem: str) -> NoReturn:
        raise StateFileError(f"{self.place}: {problem}")

    def _member(self, node: yaml.Node, key: str | None) -> Value:
        """The member under `key`; None (a key that is no scalar, which has
        no name to give): the mapping's own path, at the key's line."""
        path = (self.place.path if key is None else
                f"{self.place.path}.{key}" if self.place.path else key)
        return Value(node, Place(self.place.file, path, node.start_mark.line + 1),
                     self.constructor)

    def _item(self, node: yaml.Node, index: int) -> Value:
        return Value(node, Place(self.place.file, f"{self.place.path}[{index}]",
                                 node.start_mark.line + 1), self.constructor)

    def _kind(self) -> str:
        if isinstance(self._node, yaml.MappingNode):
            return "a mapping"
        if isinstance(self._node, yaml.SequenceNode):
            return "a list"
        return repr(self._node.value) if self._node is not None else "null"

    # -- structure -------------------------------------------------------------

    def mapping(self, keys: Iterable[str], hints: Mapping[str, str] | None = None) -> Members:
        """The members of a mapping; every key must be one of `keys`. A key
        of `hints` that is not one of them is refused with its hint (what the
        document is instead, and what to do)."""
        allowed = list(keys)
        members = Members(self, allowed)
        if self._node is None:
            return members
        if not isinstance(self._node, yaml.MappingNode):
            self.fail(f"expected a mapping, found {self._kind()}")
        for key_node, value_node in self._node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key not in allowed:
                shown = repr(key) if key is not None else "a non-scalar key"
                hint = (hints or {}).get(key or "", f"expected one of: {', '.join(allowed)}")
                self._member(key_node, key).fail(f"unknown key {shown}; {hint}")
            if key in members:
                self._member(key_node, key).fail(
                    f"repeats the key {key!r} (first on line {members[key].place.line})")
            members[key] = self._member(value_node, key)
        return members

    def sequence(self) -> list[Value]:
        if self._node is None:
            return []
        if not isinstance(self._node, yaml.SequenceNode):
            self.fail(f"expected a list, found {self._kind()}")
        return [self._item(item, index) for index, item in enumerate(self._node.value)]

    # -- scalars ---------------------------------------------------------------

    def _scalar(self, expected: str) -> yaml.ScalarNode:
        if not isinstance(self._node, yaml.ScalarNode):
            self.fail(f"expected {expected}, found {self._kind()}")
        return self._node

    def string(self) -> str:
        if self._node is None:
            return ""
        return self._scalar("a string").value

    def boolean(self) -> bool:
        if self._node is None:
            return False
        node = self._scalar("true or false")
        if node.tag != _TAG + "bool":
            self.fail(f"expected true or false, found {node.value!r}")
        return bool(self.constructor.construct_object(node))

    def integer(self, low: int, high: int) -> int:
        if self._node is None:
            return 0
        node = self._scalar("a whole number")
        if node.tag != _TAG + "int":
            self.fail(f"expected a whole number, found {node.value!r}")
        number = self.constructor.construct_object(node)
        if not low <= number <= high:
            self.fail(f"{number} is outside {low}..{high}")
        return number

    def enum(self, enum: EnumDescriptor) -> int:
        """One of `enum`'s numbers, given as the number or as its name."""
        if self._node is None:
            return 0
        node = self._scalar("a whole number or a name")
        if node.tag != _TAG + "str":
            return self.integer(*INT_RANGES[FieldDescriptor.TYPE_ENUM])
        named = enum.values_by_name.get(node.value)
        if named is None:
            self.fail(f"{node.value!r} is not one of {enum_choices(enum)}")
        return named.number

    def string_map(self) -> dict[str, str]:
        if self._node is None:
            return {}
        if not isinstance(self._node, yaml.MappingNode):
            self.fail(f"expected a mapping of strings, found {self._kind()}")
        keys = [k.value for k, _ in self._node.value if isinstance(k, yaml.ScalarNode)]
        return {key: value.string() for key, value in self.mapping(keys).items()}

    # -- protobuf messages -----------------------------------------------------

    def message(self, kind: type[M], checks: FieldChecks) -> M:
        """A new message read from this mapping (null: an empty one)."""
        message = kind()
        self.fill(message, checks)
        return message

    def fill(self, message: Message, checks: FieldChecks) -> None:
        """Read this mapping into `message` (lower-cased field names)."""
        descriptor = message.DESCRIPTOR
        fields = {f.name.lower(): f for f in descriptor.fields if f.containing_oneof is None}
        oneofs = {o.name.lower(): o for o in descriptor.oneofs}
        for key, value in self.mapping([*fields, *oneofs]).items():
            if key in oneofs:
                value._fill_oneof(message, oneofs[key].fields, checks)
            elif not value.is_null:
                value._fill_field(message, fields[key], checks)
        check = checks.get(descriptor.full_name)
        if check is not None:
            check(self, message)

    def _fill_oneof(self, message: Message, members: list[FieldDescriptor],
                    checks: FieldChecks) -> None:
        for key, value in self.mapping([f.name.lower() for f in members]).items():
            field = next(f for f in members if f.name.lower() == key)
            value._fill_field(message, field, checks)

    def _fill_field(self, message: Message, field: FieldDescriptor,
                    checks: FieldChecks) -> None:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            getattr(message, field.name).update(self.string_map())
        elif field.is_repeated:
            target = getattr(message, field.name)
            for item in self.sequence():
                if field.message_type is not None:
                    item.fill(target.add(), checks)
                else:
                    target.append(item._scalar_field(field, checks))
        elif field.message_type is not None:
            sub = getattr(message, field.name)
            sub.SetInParent()
            self.fill(sub, checks)
        else:
            setattr(message, field.name, self._scalar_field(field, checks))

    def _scalar_field(self, field: FieldDescriptor, checks: FieldChecks) -> object:
        if field.type == FieldDescriptor.TYPE_STRING:
            value: object = self.string()
        elif field.type == FieldDescriptor.TYPE_BOOL:
            value = self.boolean()
        elif field.enum_type is not None:  # the descriptor of a TYPE_ENUM field's enum
            value = self.enum(field.enum_type)
        elif field.type in INT_RANGES:
            value = self.integer(*INT_RANGES[field.type])
        else:  # pragma: no cover - localv1 has no other scalar types
            raise TypeError(f"{field.full_name}: unsupported field type {field.type}")
        check = checks.get(field.full_name)
        if check is not None:
            check(self, value)
        return value


def check_message(message: Message, checks: FieldChecks, blame: Callable[[str], Blame],
                  path: str = "") -> None:
    """Apply `checks` to a message built otherwise than by `fill` (from an
    API object), as `fill` applies them: each set scalar field's values,
    then each message. `blame(path)` is what a check blames for the field
    at `path` (lower-cased names, as the state file writes them)."""
    for field, value in message.ListFields():
        at = f"{path}.{field.name.lower()}" if path else field.name.lower()
        if field.message_type is not None:
            if field.message_type.GetOptions().map_entry:
                continue
            if field.is_repeated:
                for index, item in enumerate(value):
                    check_message(item, checks, blame, f"{at}[{index}]")
            else:
                check_message(value, checks, blame, at)
            continue
        check = checks.get(field.full_name)
        if check is not None:
            for item in value if field.is_repeated else (value,):
                check(blame(at), item)
    check = checks.get(message.DESCRIPTOR.full_name)
    if check is not None:
        check(blame(path), message)


def enum_choices(enum: EnumDescriptor) -> str:
    """`enum`'s values as a state file may give them: `TCP (1), UDP (2)`."""
    return ", ".join(f"{value.name} ({value.number})" for value in enum.values)


def read_document(text: str, file: str) -> Value:
    """The document's root; YAML syntax errors name the line."""
    with _yaml_errors(file):
        if _MAYBE_ALIAS.search(text):
            _check_alias_expansion(text, file)
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
        finally:
            loader.dispose()
    return Value(node, Place(file, "", 1), loader)


@contextmanager
def _yaml_errors(file: str) -> Iterator[None]:
    try:
        yield
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        raise StateFileError(f"{file}{line}: not valid YAML: {err.problem or err.context}") from err
    except yaml.YAMLError as err:
        raise StateFileError(f"{file}: not valid YAML: {err}") from err


def _check_alias_expansion(text: str, file: str) -> None:
    """Refuse a document whose aliases expand it past its budget of nodes.

    An alias costs a few bytes and stands for its whole anchored value: the
    document composes into a graph as small as its text, but reading it visits
    every alias's value again, so a few nested anchors multiply the work
    without bound. Counted on the parser's events (linear in the text):
    each node once, each alias as the nodes of its anchored value. The
    budget is ALIAS_EXPANSION_FACTOR times the nodes written, and at least
    ALIAS_EXPANSION_FLOOR, so modest aliasing works (KPNG's yaml.v2 reads
    aliases). An alias to a value it is inside of is left to the reader,
    whose strict types stop it (localv1 messages do not nest in themselves).
    """
    written = expanded = 0
    anchored: dict[str, int] = {}  # anchor -> nodes of its value, expanded
    open_collections: list[tuple[str | None, int]] = []  # (anchor, expanded before it)
    aliases: list[tuple[int, str, int]] = []  # (line, anchor, expanded after it)
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in anchored:
                expanded += anchored[event.anchor]
                # The parser marks every event it makes (only an Event made
                # by hand has no mark, which the stub allows).
                line = event.start_mark.line + 1  # type: ignore[union-attr]
                aliases.append((line, event.anchor, expanded))
            continue
        if isinstance(event, (yaml.ScalarEvent, yaml.CollectionStartEvent)):
            written += 1
            expanded += 1
        if isinstance(event, yaml.ScalarEvent) and event.anchor is not None:
            anchored[event.anchor] = 1
        elif isinstance(event, yaml.CollectionStartEvent):
            if event.anchor is not None:
                anchored.pop(event.anchor, None)  # not usable inside itself
            open_collections.append((event.anchor, expanded - 1))
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, before = open_collections.pop()
            if anchor is not None:
                anchored[anchor] = expanded - before
    budget = max(ALIAS_EXPANSION_FLOOR, ALIAS_EXPANSION_FACTOR * written)
    for line, anchor, total in aliases:
        if total > budget:
            raise StateFileError(
                f"{file}:{line}: the alias *{anchor} takes the document past {budget} nodes "
                f"once its aliases are expanded ({written} nodes as written; at most "
                f"{ALIAS_EXPANSION_FACTOR} times that, or {ALIAS_EXPANSION_FLOOR}, are read); "
                "write the aliased values out instead")
