"""The fast twin of `reader.Value`: the same accessors over plain values (what
`blockyaml.load_block` reads), without places, and failing without a message.

statefile.py reads a document through one interface, so both readers accept
the same documents and build the same values: `PlainValue` where the fast
path can, `reader.Value` where it cannot or where it found a problem, to say
where and what. `PlainValue.fail` raises `Unchecked`: the caller then runs the
strict reader, which produces the error message (or, if the fast reader was
stricter than needed, the state).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Iterable, Mapping, NoReturn

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from kpng_py.brain.blockyaml import Plain
from kpng_py.brain.reader import INT_RANGES, FieldChecks, Place


class Unchecked(Exception):
    """The fast reader found something it does not vouch for: read the
    document with the strict reader."""


class PlainMembers(dict):
    """A mapping's members by key; an allowed key that is absent reads as null."""

    def __init__(self, members: dict[str, PlainValue], allowed: Iterable[str]) -> None:
        super().__init__(members)
        self._allowed = allowed

    def __missing__(self, key: str) -> PlainValue:
        if key not in self._allowed:
            raise KeyError(key)
        return _NULL


class PlainValue:
    """One plain value (None when absent or null), read as `reader.Value` reads."""

    __slots__ = ("_value",)

    def __init__(self, value: Plain) -> None:
        self._value = value

    @property
    def is_null(self) -> bool:
        return self._value is None

    def fail(self, problem: str) -> NoReturn:
        raise Unchecked(problem)

    @property
    def place(self) -> Place:
        return _NOWHERE

    def mapping(self, keys: Iterable[str], hints: Mapping[str, str] | None = None
                ) -> PlainMembers:
        """As `Value.mapping`; a key not in `keys` fails, and the strict
        reader then names it (with its hint)."""
        value = self._value
        if value is None:
            return PlainMembers({}, keys)
        if type(value) is not dict:
            self.fail("expected a mapping")
        for key in value:
            if key not in keys:
                self.fail(f"unknown key {key!r}")
        return PlainMembers({key: PlainValue(item) for key, item in value.items()}, keys)

    def sequence(self) -> list[PlainValue]:
        value = self._value
        if value is None:
            return []
        if type(value) is not list:
            self.fail("expected a list")
        return [PlainValue(item) for item in value]

    def string(self) -> str:
        return _text(self._value)

    def boolean(self) -> bool:
        return _boolean(self._value)

    def integer(self, low: int, high: int) -> int:
        return _integer(self._value, low, high)

    def string_map(self) -> dict[str, str]:
        return _string_map(self._value)

    def fill(self, message: Message, checks: FieldChecks) -> None:
        _fill(message, self._value, _plan(message.DESCRIPTOR), checks)


_NULL = PlainValue(None)
_NOWHERE = Place("", "", None)  # the fast path names no place: the strict one will


def _unchecked(problem: str) -> NoReturn:
    raise Unchecked(problem)


class _Blame:
    """What the field checks blame in the fast path: no place, no message."""

    @staticmethod
    def fail(problem: str) -> NoReturn:
        _unchecked(problem)


_BLAME = _Blame()


def _text(value: Plain) -> str:
    """A string field takes any scalar's text (blockyaml keeps only the
    scalars whose text the value tells)."""
    if type(value) is str:
        return value
    if type(value) is bool:
        return "true" if value else "false"
    if type(value) is int:
        return str(value)
    if value is None:
        return ""
    _unchecked("expected a string")


def _boolean(value: Plain) -> bool:
    if type(value) is bool:
        return value
    if value is None:
        return False
    _unchecked("expected true or false")


def _integer(value: Plain, low: int, high: int) -> int:
    if type(value) is int:
        if low <= value <= high:
            return value
        _unchecked("out of range")
    if value is None:
        return 0
    _unchecked("expected a whole number")


def _string_map(value: Plain) -> dict[str, str]:
    if value is None:
        return {}
    if type(value) is not dict:
        _unchecked("expected a mapping of strings")
    return {key: _text(item) for key, item in value.items()}


# -- protobuf messages, as reader.Value.fill reads them ----------------------------


@dataclass(frozen=True)
class _Field:
    full_name: str  # what its checks are found by
    name: str
    is_map: bool
    is_repeated: bool
    message: Descriptor | None
    scalar_type: int
    enum_numbers: Mapping[str, int] | None  # an enum's numbers by name


@dataclass(frozen=True)
class _Plan:
    """A message's fields by lower-cased name, and its oneofs' members."""

    full_name: str
    fields: dict[str, _Field]
    oneofs: dict[str, dict[str, _Field]]


@cache
def _plan(descriptor: Descriptor) -> _Plan:
    def field(f: FieldDescriptor) -> _Field:
        is_map = f.message_type is not None and f.message_type.GetOptions().map_entry
        numbers = ({v.name: v.number for v in f.enum_type.values}
                   if f.enum_type is not None else None)
        return _Field(f.full_name, f.name, is_map, f.is_repeated, f.message_type, f.type,
                      numbers)

    return _Plan(
        descriptor.full_name,
        {f.name.lower(): field(f) for f in descriptor.fields if f.containing_oneof is None},
        {o.name.lower(): {f.name.lower(): field(f) for f in o.fields}
         for o in descriptor.oneofs})


def _fill(message: Message, value: Plain, plan: _Plan, checks: FieldChecks) -> None:
    if value is not None:
        if type(value) is not dict:
            _unchecked("expected a mapping")
        fields = plan.fields
        for key, item in value.items():
            field = fields.get(key)
            if field is not None:
                if item is not None:
                    _fill_field(message, field, item, checks)
                continue
            members = plan.oneofs.get(key)
            if members is None:
                _unchecked(f"unknown key {key!r}")
            if item is None:
                continue
            if type(item) is not dict:
                _unchecked("expected a mapping")
            for member_key, member in item.items():
                if member_key not in members:
                    _unchecked(f"unknown key {member_key!r}")
                _fill_field(message, members[member_key], member, checks)
    check = checks.get(plan.full_name)
    if check is not None:
        check(_BLAME, message)


def _fill_field(message: Message, field: _Field, value: Plain, checks: FieldChecks) -> None:
    if field.is_map:
        getattr(message, field.name).update(_string_map(value))
    elif field.is_repeated:
        if value is None:
            return
        if type(value) is not list:
            _unchecked("expected a list")
        target = getattr(message, field.name)
        if field.message is not None:
            plan = _plan(field.message)
            for item in value:
                _fill(target.add(), item, plan, checks)
        else:
            target.extend([_scalar(field, item, checks) for item in value])
    elif field.message is not None:
        sub = getattr(message, field.name)
        sub.SetInParent()
        _fill(sub, value, _plan(field.message), checks)
    else:
        setattr(message, field.name, _scalar(field, value, checks))


def _scalar(field: _Field, value: Plain, checks: FieldChecks) -> object:
    kind = field.scalar_type
    if kind == FieldDescriptor.TYPE_STRING:
        result: object = _text(value)
    elif kind == FieldDescriptor.TYPE_BOOL:
        result = _boolean(value)
    elif type(value) is str and field.enum_numbers is not None:
        result = field.enum_numbers.get(value)
        if result is None:
            _unchecked("not a name of the enum")
    else:
        result = _integer(value, *INT_RANGES[kind])
    check = checks.get(field.full_name)
    if check is not None:
        check(_BLAME, result)
    return result
