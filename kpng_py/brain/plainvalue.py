"""The fast twin of `reader.Value`: the same accessors over plain values (what
`plainload.plain_document` reads), without places, and failing without a message.

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
from typing import Callable, Iterable, Mapping, NoReturn, TypeVar

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from kpng_py.brain.plainload import Plain, Unchecked
from kpng_py.brain.reader import INT_RANGES, FieldChecks, Place

M = TypeVar("M", bound=Message)


class PlainMembers(dict):
    """A mapping's members by key; an allowed key that is absent reads as null."""

    __slots__ = ("_allowed",)

    def __init__(self, allowed: Iterable[str]) -> None:
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
        members = PlainMembers(keys)
        if value is None:
            return members
        if type(value) is not dict:
            self.fail("expected a mapping")
        for key, item in value.items():
            if key not in keys:
                self.fail(f"unknown key {key!r}")
            members[key] = PlainValue(item)
        return members

    def sequence(self) -> list[PlainValue]:
        value = self._value
        if value is None:
            return []
        if type(value) is not list:
            self.fail("expected a list")
        return [PlainValue(item) for item in value]

    def string(self) -> str:
        value = self._value
        return value if type(value) is str else _text(value)

    def boolean(self) -> bool:
        return _boolean(self._value)

    def integer(self, low: int, high: int) -> int:
        return _integer(self._value, low, high)

    def string_map(self) -> dict[str, str]:
        return _string_map(self._value)

    def message(self, kind: type[M], checks: FieldChecks) -> M:
        return _message(self._value, _plan(kind.DESCRIPTOR), checks)  # type: ignore[return-value]


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
    """A string field takes any scalar's text; a typed value does not tell
    its text (`+1`, `0x1`, `TRUE`), so only a string is read here."""
    if type(value) is str:
        return value
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
    if not all(type(key) is str for key in value):
        _unchecked("a key that is not a string")
    return {key: _text(item) for key, item in value.items()}


# -- protobuf messages, as reader.Value.fill reads them ----------------------------
#
# A message is built in one constructor call from the values read for its
# fields (protobuf copies them in compiled code): a third of the time of
# setting each field on a message in place.


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
    """A message's class, its fields by lower-cased name, and its oneofs'
    members."""

    full_name: str
    new: Callable[..., Message]
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
        descriptor.full_name, GetMessageClass(descriptor),
        {f.name.lower(): field(f) for f in descriptor.fields if f.containing_oneof is None},
        {o.name.lower(): {f.name.lower(): field(f) for f in o.fields}
         for o in descriptor.oneofs})


def _message(value: Plain, plan: _Plan, checks: FieldChecks) -> Message:
    """A new message read from `value` (None: an empty one), checked."""
    fields: dict[str, object] = {}
    if value is not None:
        if type(value) is not dict:
            _unchecked("expected a mapping")
        for key, item in value.items():
            field = plan.fields.get(key)
            if field is None:
                fields.update(_oneof(key, item, plan, checks))
            elif item is not None:
                fields[field.name] = _field(field, item, checks)
    message = plan.new(**fields)
    check = checks.get(plan.full_name)
    if check is not None:
        check(_BLAME, message)
    return message


def _oneof(key: str, value: Plain, plan: _Plan, checks: FieldChecks) -> dict[str, object]:
    """The fields set by a oneof given under its own name: a null member is
    an empty message, as the strict reader sets it."""
    members = plan.oneofs.get(key)
    if members is None:
        _unchecked(f"unknown key {key!r}")
    if value is None:
        return {}
    if type(value) is not dict:
        _unchecked("expected a mapping")
    fields = {}
    for member_key, member in value.items():
        field = members.get(member_key)
        if field is None:
            _unchecked(f"unknown key {member_key!r}")
        fields[field.name] = _field(field, member, checks)
    return fields


def _field(field: _Field, value: Plain, checks: FieldChecks) -> object:
    if field.is_map:
        return _string_map(value)
    if field.message is not None:
        plan = _plan(field.message)
        if not field.is_repeated:
            return _message(value, plan, checks)
        if type(value) is not list:
            _unchecked("expected a list")
        return [_message(item, plan, checks) for item in value]
    if field.is_repeated:
        if type(value) is not list:
            _unchecked("expected a list")
        # Most repeated scalars are strings (IPs, ranges, zones): kept as they are.
        if field.scalar_type == FieldDescriptor.TYPE_STRING and all(
                type(item) is str for item in value):
            scalars = value
        else:
            scalars = [_scalar(field, item) for item in value]
    else:
        scalars = [_scalar(field, value)]
    check = checks.get(field.full_name)
    if check is not None:
        for scalar in scalars:
            check(_BLAME, scalar)
    return scalars if field.is_repeated else scalars[0]


def _scalar(field: _Field, value: Plain) -> object:
    kind = field.scalar_type
    if kind == FieldDescriptor.TYPE_STRING:
        return _text(value)
    if kind == FieldDescriptor.TYPE_BOOL:
        return _boolean(value)
    if type(value) is str and field.enum_numbers is not None:
        number = field.enum_numbers.get(value)
        if number is None:
            _unchecked("not a name of the enum")
        return number
    return _integer(value, *INT_RANGES[kind])
