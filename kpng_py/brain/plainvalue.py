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
                ) -> dict[str, PlainValue]:
        """As `Value.mapping`: each of `keys` (an absent one null); a key
        not in `keys` fails, and the strict reader then names it (with its
        hint)."""
        value = self._value
        members = dict.fromkeys(keys, _NULL)
        if value is None:
            return members
        if type(value) is not dict:
            self.fail("expected a mapping")
        if not value.keys() <= members.keys():
            self.fail("an unknown key")
        for key, item in value.items():
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
# setting each field on a message in place. Each field's reading is a
# function made once per message type, for its kind of field: a file of
# 100 000 endpoints reads each of their fields without asking again what
# kind it is (docs/bench.md, "The brain's reader").

# A field's reading: its plain value (not null) and the checks -> the value
# the message's constructor takes.
_FieldRead = Callable[[Plain, FieldChecks], object]


@dataclass(frozen=True, slots=True)
class _Plan:
    """A message's class and its fields' readings, by lower-cased name: its
    fields' (name, reading), and its oneofs' members' by the oneof's name."""

    full_name: str
    new: Callable[..., Message]
    fields: dict[str, tuple[str, _FieldRead]]
    oneofs: dict[str, dict[str, tuple[str, _FieldRead]]]


@cache
def _plan(descriptor: Descriptor) -> _Plan:
    def named(fields: Iterable[FieldDescriptor]) -> dict[str, tuple[str, _FieldRead]]:
        return {f.name.lower(): (f.name, _reading(f)) for f in fields}

    return _Plan(
        descriptor.full_name, GetMessageClass(descriptor),
        named(f for f in descriptor.fields if f.containing_oneof is None),
        {o.name.lower(): named(o.fields) for o in descriptor.oneofs})


def _message(value: Plain, plan: _Plan, checks: FieldChecks) -> Message:
    """A new message read from `value` (None: an empty one), checked."""
    fields: dict[str, object] = {}
    if value is not None:
        if type(value) is not dict:
            _unchecked("expected a mapping")
        known = plan.fields
        for key, item in value.items():
            field = known.get(key)
            if field is None:
                fields.update(_oneof(key, item, plan, checks))
            elif item is not None:
                name, read = field
                fields[name] = read(item, checks)
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
        name, read = field
        fields[name] = read(member, checks)
    return fields


def _reading(field: FieldDescriptor) -> _FieldRead:
    """How a field of this kind is read (a member of a oneof may be null)."""
    if field.message_type is not None:
        if field.message_type.GetOptions().map_entry:
            return _map_reading
        return _messages_reading(field.message_type, field.is_repeated)
    return _scalars_reading(field.full_name, _scalar_reading(field), field.is_repeated,
                            field.type == FieldDescriptor.TYPE_STRING)


def _map_reading(value: Plain, checks: FieldChecks) -> object:
    return _string_map(value)


def _messages_reading(descriptor: Descriptor, repeated: bool) -> _FieldRead:
    """A message field's reading (the message's own plan found when first
    read: a message type may contain itself)."""
    def one(value: Plain, checks: FieldChecks) -> object:
        return _message(value, _plan(descriptor), checks)

    def each(value: Plain, checks: FieldChecks) -> object:
        if type(value) is not list:
            _unchecked("expected a list")
        plan = _plan(descriptor)
        return [_message(item, plan, checks) for item in value]

    return each if repeated else one


def _scalars_reading(full_name: str, scalar: Callable[[Plain], object], repeated: bool,
                     strings: bool) -> _FieldRead:
    """A scalar field's reading, each value checked by the check of its
    full name, if any."""
    def one(value: Plain, checks: FieldChecks) -> object:
        read = scalar(value)
        check = checks.get(full_name)
        if check is not None:
            check(_BLAME, read)
        return read

    def each(value: Plain, checks: FieldChecks) -> object:
        if type(value) is not list:
            _unchecked("expected a list")
        # Most repeated scalars are strings (IPs, ranges, zones): kept as they are.
        read = value if strings and _all_strings(value) else [scalar(item) for item in value]
        check = checks.get(full_name)
        if check is not None:
            for item in read:
                check(_BLAME, item)
        return read

    return each if repeated else one


def _all_strings(values: list[Plain]) -> bool:
    for value in values:
        if type(value) is not str:
            return False
    return True


def _scalar_reading(field: FieldDescriptor) -> Callable[[Plain], object]:
    """A scalar's reading: a string, a bool, an enum's number (or name) or
    a whole number in its type's range."""
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        return _text
    if kind == FieldDescriptor.TYPE_BOOL:
        return _boolean
    low, high = INT_RANGES[kind]
    numbers = ({v.name: v.number for v in field.enum_type.values}
               if field.enum_type is not None else None)

    def number(value: Plain) -> object:
        if type(value) is int and low <= value <= high:
            return value
        if type(value) is str and numbers is not None:
            found = numbers.get(value)
            if found is None:
                _unchecked("not a name of the enum")
            return found
        return _integer(value, low, high)

    return number
