"""The few pieces of protobuf's wire format the brain writes itself: keys,
varints, length-delimited fields. Callers build bytes that protobuf's
deterministic serialization would write (fields in number order, defaults
left out); their tests compare them with protobuf's."""

from __future__ import annotations

from google.protobuf.message import Message

LENGTH_DELIMITED, VARINT = 2, 0
# The varints of 0..127: one byte each (most lengths written).
SHORT_VARINTS = tuple(bytes([n]) for n in range(0x80))


def varint(number: int) -> bytes:
    """An unsigned number as a varint."""
    if number < 0x80:
        return SHORT_VARINTS[number]
    out = bytearray()
    while number > 0x7F:
        out.append(number & 0x7F | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


def delimited(key: bytes, data: bytes) -> bytes:
    """A length-delimited field: its key, its length, its bytes."""
    size = len(data)
    return key + (SHORT_VARINTS[size] if size < 0x80 else varint(size)) + data


def key(message: type[Message], field: str, wire_type: int = LENGTH_DELIMITED) -> bytes:
    """The key protobuf writes before `field` of `message`."""
    return varint(message.DESCRIPTOR.fields_by_name[field].number << 3 | wire_type)
